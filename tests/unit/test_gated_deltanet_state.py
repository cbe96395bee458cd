"""The recurrent-state hook of a Gated DeltaNet layer: what it holds and how an edit propagates,
checked against HF's own delta-rule functions run by hand."""

from __future__ import annotations

import functools

import torch
from transformers.models.qwen3_5 import modeling_qwen3_5 as hf_qwen3_5

LAYER = 0
NAMES = ("hook_q", "hook_k", "hook_v", "hook_g", "hook_beta", "hook_core_out", "hook_recurrent_state")


@functools.lru_cache(maxsize=1)
def _model():
    from vlens import HookedVLM
    from vlens.testing import tiny_qwen3_5_model, tiny_qwen3_vl_processor

    hf = tiny_qwen3_5_model(seed=5, n_layers=2, d_model=32, n_heads=2, n_kv_heads=1, d_head=16, linear_heads=4,
                            linear_key_heads=2, linear_d_head=6, linear_d_key=5)
    return HookedVLM.from_hf(hf, processor=tiny_qwen3_vl_processor())


def _run(model, inputs, edit=None):
    store = {}

    def keep(x, hook):
        store[hook.name.rsplit(".", 1)[-1]] = x.detach().clone()

    hooks = [(f"blocks.{LAYER}.attn.{name}", keep) for name in NAMES]
    if edit is not None:
        hooks.insert(-1, (f"blocks.{LAYER}.attn.hook_recurrent_state", edit))  # edit, then keep what it made
    with torch.no_grad():
        model.run_with_hooks(inputs, fwd_hooks=hooks)
    return store


def _read(state, q):
    """o = S^T q with q L2-normalised and scaled by d_key^-1/2 (HF's rule), q repeated to the value heads."""
    ratio = state.shape[-3] // q.shape[-2]
    q = q.repeat_interleave(ratio, dim=-2).float()
    q = q * torch.rsqrt((q * q).sum(-1, keepdim=True) + 1e-6) / q.shape[-1] ** 0.5
    return (state * q.unsqueeze(-1)).sum(-2)


def test_the_state_is_the_one_hf_chunked_rule_ends_with():
    model = _model()
    inputs = model.prepare(prompts=["How many dots are there ? red blue green"])
    acts = _run(model, inputs)
    _, final = hf_qwen3_5.torch_chunk_gated_delta_rule(
        acts["hook_q"], acts["hook_k"], acts["hook_v"], g=acts["hook_g"], beta=acts["hook_beta"],
        output_final_state=True, use_qk_l2norm_in_kernel=True)
    torch.testing.assert_close(acts["hook_recurrent_state"][:, -1], final, atol=1e-5, rtol=0)
    # the read-out at every position is S_t^T q_t
    torch.testing.assert_close(_read(acts["hook_recurrent_state"], acts["hook_q"]), acts["hook_core_out"],
                               atol=1e-5, rtol=0)


def test_a_patched_state_propagates_through_the_later_positions():
    model = _model()
    inputs = model.prepare(prompts=["How many dots are there ? red blue green"])
    other = model.prepare(prompts=["yes no left of right ? 1 2 3 4"])
    clean, donor = _run(model, inputs), _run(model, other)
    t = 4
    patched_state = donor["hook_recurrent_state"][:, t]

    def patch(state, hook):
        state = state.clone()
        state[:, t] = patched_state
        return state

    edited = _run(model, inputs, patch)
    core = edited["hook_core_out"]
    torch.testing.assert_close(core[:, :t], clean["hook_core_out"][:, :t], atol=1e-6, rtol=0)  # earlier: untouched
    torch.testing.assert_close(core[:, t], _read(patched_state[:, None], clean["hook_q"][:, t:t + 1])[:, 0],
                               atol=1e-5, rtol=0)
    # later positions: HF's recurrent rule started from the patched state on the clean inputs after t
    after = slice(t + 1, None)
    expected, _ = hf_qwen3_5.torch_recurrent_gated_delta_rule(
        clean["hook_q"][:, after], clean["hook_k"][:, after], clean["hook_v"][:, after], g=clean["hook_g"][:, after],
        beta=clean["hook_beta"][:, after], initial_state=patched_state, use_qk_l2norm_in_kernel=True)
    torch.testing.assert_close(core[:, after], expected, atol=1e-5, rtol=0)
    assert (core[:, after] - clean["hook_core_out"][:, after]).abs().max() > 1e-3  # the patch reached them


def test_an_edit_of_one_head_leaves_the_other_heads_alone():
    model = _model()
    inputs = model.prepare(prompts=["How many dots are there ? red blue green"])
    clean = _run(model, inputs)

    def zero_head(state, hook):
        state = state.clone()
        state[:, 2:, 1] = 0
        return state

    edited = _run(model, inputs, zero_head)
    others = [0, 2, 3]
    torch.testing.assert_close(edited["hook_core_out"][:, :, others], clean["hook_core_out"][:, :, others])
    assert edited["hook_core_out"][:, 2:, 1].abs().max() == 0
    torch.testing.assert_close(edited["hook_core_out"][:, :2], clean["hook_core_out"][:, :2])


def test_zeroing_every_state_silences_the_layer_and_generation_uses_the_edited_state():
    model = _model()
    inputs = model.prepare(prompts=["How many dots are there ?"])
    edited = _run(model, inputs, lambda state, hook: torch.zeros_like(state))
    assert edited["hook_core_out"].abs().max() == 0
    # during decoding the hook sees one position per step, starting from the (edited) cached state
    seen = []

    def zero_and_keep(state, hook):
        seen.append(state.shape[1])
        return torch.zeros_like(state)

    out = model.generate(inputs, max_new_tokens=3, fwd_hooks=[(f"blocks.{LAYER}.attn.hook_recurrent_state",
                                                               zero_and_keep)])
    assert seen[0] == inputs.seq_len and all(n == 1 for n in seen[1:]) and len(seen) == out.tokens.shape[1]

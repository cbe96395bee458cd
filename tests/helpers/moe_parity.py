"""Parity checks for mixture-of-experts MLPs and Gated DeltaNet layers, against the HF model they wrap.

Each edit made through a vlens hook is made on the HF side too: through HF's parameters where the
edit is linear in one (scaling a router row, an expert's down projection, A_log), or by replacing
an HF module's output with the edited one (the router's (logits, weights, indices), a projection's
output). The HF model is restored afterwards.
"""

from __future__ import annotations

import math
from contextlib import contextmanager

import torch

from tests.helpers.arch_parity import hf_logits, input_matrix

PARITY_IMAGE_SIZES = [(64, 64), (96, 64), (64, 128), (64, 64), (96, 96), (64, 96)]


class TinyPairs:
    """(HF model, HookedVLM) and the parity inputs (`input_matrix`) for each named shape of one family,
    built on first use and kept for the test module. builder: a `vlens.testing` model builder's name."""

    def __init__(self, builder: str, shapes: dict[str, dict]):
        self.builder, self.shapes = builder, shapes
        self._pairs: dict[str, tuple] = {}
        self._cases: dict[str, dict] = {}

    def pair(self, shape: str):
        if shape not in self._pairs:
            from vlens import HookedVLM, testing

            hf = getattr(testing, self.builder)(seed=len(shape), **self.shapes[shape])
            self._pairs[shape] = (hf, HookedVLM.from_hf(hf, processor=testing.tiny_qwen3_vl_processor()))
        return self._pairs[shape]

    def cases(self, shape: str) -> dict:
        if shape not in self._cases:
            self._cases[shape] = input_matrix(self.pair(shape)[1], PARITY_IMAGE_SIZES)
        return self._cases[shape]


def hf_layer(model, hf, layer: int):
    return model.adapter.language_model(hf).layers[layer]


@contextmanager
def edited_parameter(param: torch.nn.Parameter, edit):
    """`param` edited in place by `edit(param_data)` (a no_grad callable) for the duration; restored after."""
    saved = param.detach().clone()
    try:
        with torch.no_grad():
            edit(param.data)
        yield
    finally:
        with torch.no_grad():
            param.data.copy_(saved)


def ours(model, inputs, hooks):
    with torch.no_grad():
        return model.run_with_hooks(inputs, fwd_hooks=hooks)


def assert_close_and_moved(got, expected, plain, what: str, atol: float = 1e-4) -> None:
    torch.testing.assert_close(got, expected, atol=atol, rtol=0, msg=what)
    assert (got - plain).abs().max() > 1e-4, f"{what}: the edit changed nothing"


# ------------------------------------------------------------------ mixture of experts

def experts_by_use(model, inputs, layer: int) -> list[int]:
    """The experts of `layer`, most often chosen on `inputs` first (edits of unused experts change nothing)."""
    _, cache = model.run_with_cache(inputs, names_filter=f"blocks.{layer}.mlp.hook_expert_indices")
    real = inputs.attention_mask.bool()
    counts = torch.bincount(cache[f"blocks.{layer}.mlp.hook_expert_indices"][real].flatten(),
                            minlength=model.cfg.n_experts)
    return counts.argsort(descending=True, stable=True).tolist()


def assert_router_scale_matches_hf(model, hf, inputs, layer: int, expert: int, scale: float = 4.0) -> None:
    """Scaling one expert's router logit equals scaling that row of HF's router weight."""
    def edit(logits, hook):
        logits = logits.clone()
        logits[..., expert] *= scale
        return logits

    got = ours(model, inputs, [(f"blocks.{layer}.mlp.hook_router_logits", edit)])
    with edited_parameter(hf_layer(model, hf, layer).mlp.gate.weight, lambda w: w[expert].mul_(scale)):
        expected = hf_logits(hf, inputs)
    assert_close_and_moved(got, expected, ours(model, inputs, []), "router logit scale")


def assert_expert_out_scale_matches_hf(model, hf, inputs, layer: int, expert: int, scale: float = 0.0) -> None:
    """Scaling (default: zeroing) one expert's output where it is chosen equals scaling its HF down projection."""
    store = {}

    def keep(indices, hook):
        store["indices"] = indices

    def edit(out, hook):
        chosen = (store["indices"] == expert)[..., None]
        return torch.where(chosen, out * scale, out)

    got = ours(model, inputs, [(f"blocks.{layer}.mlp.hook_expert_indices", keep),
                                (f"blocks.{layer}.mlp.hook_expert_out", edit)])
    experts = hf_layer(model, hf, layer).mlp.experts
    with edited_parameter(experts.down_proj, lambda w: w[expert].mul_(scale)):
        expected = hf_logits(hf, inputs)
    assert_close_and_moved(got, expected, ours(model, inputs, []), "expert output scale")


def replace_router_output(weights=None, indices=None):
    """An HF router forward hook that replaces its top-k weights and/or indices by functions of the originals."""
    def hook(module, args, output):
        logits, scores, chosen = output
        return (logits, scores if weights is None else weights(scores), chosen if indices is None else indices(chosen))
    return hook


def assert_routing_edits_match_hf(model, hf, inputs, layer: int) -> None:
    """Halved expert weights, and forcing every token to experts 0..k-1, equal the same router outputs in HF."""
    router = hf_layer(model, hf, layer).mlp.gate
    plain = ours(model, inputs, [])
    k = model.blocks[layer].mlp.top_k

    def halve(w):
        return 0.5 * w

    got = ours(model, inputs, [(f"blocks.{layer}.mlp.hook_expert_weights", lambda w, hook: halve(w))])
    expected = hf_logits(hf, inputs, forward_hooks=[(router, replace_router_output(weights=halve))])
    assert_close_and_moved(got, expected, plain, "halved expert weights")

    def first_k(i):
        return torch.arange(k, device=i.device).expand_as(i).contiguous()

    got = ours(model, inputs, [(f"blocks.{layer}.mlp.hook_expert_indices", lambda i, hook: first_k(i))])
    expected = hf_logits(hf, inputs, forward_hooks=[(router, replace_router_output(indices=first_k))])
    assert_close_and_moved(got, expected, plain, "forced expert indices")


def assert_shared_expert_edit_matches_hf(model, hf, inputs, layer: int) -> None:
    """Zeroing the shared expert's gate equals HF with the shared expert's output zeroed."""
    shared = hf_layer(model, hf, layer).mlp.shared_expert
    got = ours(model, inputs, [(f"blocks.{layer}.mlp.hook_shared_gate", lambda g, hook: torch.zeros_like(g))])
    expected = hf_logits(hf, inputs, forward_hooks=[(shared, lambda m, a, out: torch.zeros_like(out))])
    assert_close_and_moved(got, expected, ours(model, inputs, []), "shared expert gate")


def assert_moe_decomposition(model, inputs, layer: int) -> None:
    """hook_mlp_out == sum_k weight_k * expert_out_k (+ the gated shared expert), and the hook shapes."""
    _, cache = model.run_with_cache(inputs, names_filter=lambda n: n.startswith(f"blocks.{layer}."))
    c, (b, p) = model.cfg, inputs.input_ids.shape
    k = model.blocks[layer].mlp.top_k
    mlp = f"blocks.{layer}.mlp"
    assert tuple(cache[f"{mlp}.hook_router_logits"].shape) == (b, p, c.n_experts)
    assert tuple(cache[f"{mlp}.hook_expert_weights"].shape) == (b, p, k)
    assert tuple(cache[f"{mlp}.hook_expert_indices"].shape) == (b, p, k)
    assert cache[f"{mlp}.hook_expert_indices"].dtype == torch.long
    assert tuple(cache[f"{mlp}.hook_expert_out"].shape) == (b, p, k, c.d_model)
    routed = (cache[f"{mlp}.hook_expert_out"] * cache[f"{mlp}.hook_expert_weights"][..., None]).sum(2)
    total = routed + (cache[f"{mlp}.hook_shared_out"] if f"{mlp}.hook_shared_out" in cache.cache_dict else 0)
    torch.testing.assert_close(total, cache[f"blocks.{layer}.hook_mlp_out"], atol=1e-5, rtol=0)
    weights = cache[f"{mlp}.hook_expert_weights"]
    torch.testing.assert_close(weights.sum(-1), torch.ones_like(weights[..., 0]), atol=1e-5, rtol=0)


# ------------------------------------------------------------------ Gated DeltaNet

def assert_linear_gate_edits_match_hf(model, hf, inputs, layer: int, head: int) -> None:
    """hook_beta and hook_g edits on one head equal the matching edits of HF's in_proj_b output and A_log."""
    attn = hf_layer(model, hf, layer).linear_attn
    plain = ours(model, inputs, [])

    def halve_beta(beta, hook):
        beta = beta.clone()
        beta[..., head] = 0.5 * beta[..., head]
        return beta

    def halve_beta_hf(module, args, out):  # beta = sigmoid(b): the b whose sigmoid is half
        out = out.clone()
        out[..., head] = torch.logit(0.5 * torch.sigmoid(out[..., head]))
        return out

    got = ours(model, inputs, [(f"blocks.{layer}.attn.hook_beta", halve_beta)])
    expected = hf_logits(hf, inputs, forward_hooks=[(attn.in_proj_b, halve_beta_hf)])
    assert_close_and_moved(got, expected, plain, "hook_beta")

    def scale_g(g, hook):
        g = g.clone()
        g[..., head] = 3.0 * g[..., head]
        return g

    got = ours(model, inputs, [(f"blocks.{layer}.attn.hook_g", scale_g)])
    with edited_parameter(attn.A_log, lambda a: a[head].add_(math.log(3.0))):  # g = -exp(A_log) * softplus(.)
        expected = hf_logits(hf, inputs)
    assert_close_and_moved(got, expected, plain, "hook_g")


def assert_linear_value_edit_matches_hf(model, hf, inputs, layer: int, head: int) -> None:
    """Zeroing one head's v (after the short convolution) equals zeroing its rows of HF's in_proj_qkv
    (the conv of zeros is zero, silu(0) = 0)."""
    c = model.cfg
    start = 2 * c.linear_n_key_heads * c.linear_d_key + head * c.linear_d_head
    attn = hf_layer(model, hf, layer).linear_attn

    def zero_v(v, hook):
        v = v.clone()
        v[:, :, head] = 0
        return v

    got = ours(model, inputs, [(f"blocks.{layer}.attn.hook_v", zero_v)])
    with edited_parameter(attn.in_proj_qkv.weight, lambda w: w[start:start + c.linear_d_head].zero_()):
        expected = hf_logits(hf, inputs)
    assert_close_and_moved(got, expected, ours(model, inputs, []), "hook_v")


def assert_linear_hook_shapes(model, inputs, layer: int) -> None:
    """Shapes of a linear-attention layer's hooks (the state only when hooked), and no pattern hooks."""
    c, (b, p) = model.cfg, inputs.input_ids.shape
    attn = f"blocks.{layer}.attn"
    _, cache = model.run_with_cache(inputs, names_filter=lambda n: n.startswith(attn))
    expected = {
        "hook_q": (b, p, c.linear_n_key_heads, c.linear_d_key), "hook_k": (b, p, c.linear_n_key_heads, c.linear_d_key),
        "hook_v": (b, p, c.linear_n_heads, c.linear_d_head), "hook_beta": (b, p, c.linear_n_heads),
        "hook_g": (b, p, c.linear_n_heads), "hook_core_out": (b, p, c.linear_n_heads, c.linear_d_head),
        "hook_output_gate": (b, p, c.linear_n_heads, c.linear_d_head), "hook_z": (b, p, c.linear_n_heads, c.linear_d_head),
        "hook_recurrent_state": (b, p, c.linear_n_heads, c.linear_d_key, c.linear_d_head),
    }
    for name, shape in expected.items():
        assert tuple(cache[f"{attn}.{name}"].shape) == shape, name
    assert f"{attn}.hook_pattern" not in model.hook_dict and f"{attn}.hook_attn_scores" not in model.hook_dict
    assert bool((cache[f"{attn}.hook_g"] <= 0).all()) and bool(((cache[f"{attn}.hook_beta"] > 0)
                                                                 & (cache[f"{attn}.hook_beta"] < 1)).all())


def assert_layer_head_decomposition(model, inputs) -> None:
    """sum_h z_h @ W_O[h] + b_O == hook_attn_out at every layer, linear-attention layers included."""
    _, cache = model.run_with_cache(inputs, names_filter=lambda n: n.endswith(("hook_z", "hook_attn_out")))
    for layer in range(model.cfg.n_layers):
        attn = model.blocks[layer].attn
        z = cache[f"blocks.{layer}.attn.hook_z"]
        assert z.shape[-2:] == (model.cfg.heads_at(layer), model.cfg.d_head_at(layer))
        per_head = torch.einsum("bphd,hdm->bphm", z, attn.W_O)
        torch.testing.assert_close(per_head.sum(2) + attn.b_O, cache[f"blocks.{layer}.hook_attn_out"],
                                   atol=1e-5, rtol=0, msg=f"layer {layer}")


def assert_output_gate_edit_matches_hf(model, hf, inputs, layer: int, head: int) -> None:
    """Halving one full-attention head's output gate equals the same change of HF's gate half of q_proj."""
    d_head = model.cfg.d_head
    sa = hf_layer(model, hf, layer).self_attn

    def halve(gate, hook):
        gate = gate.clone()
        gate[:, :, head] = 0.5 * gate[:, :, head]
        return gate

    def halve_hf(module, args, out):  # q_proj's output per head is [query; gate]
        out = out.clone()
        cols = slice((2 * head + 1) * d_head, (2 * head + 2) * d_head)
        out[..., cols] = torch.logit(0.5 * torch.sigmoid(out[..., cols]))
        return out

    got = ours(model, inputs, [(f"blocks.{layer}.attn.hook_output_gate", halve)])
    expected = hf_logits(hf, inputs, forward_hooks=[(sa.q_proj, halve_hf)])
    assert_close_and_moved(got, expected, ours(model, inputs, []), "output gate")


def assert_decoding_equals_full_forward(model, inputs, max_new_tokens: int = 5) -> None:
    """The cached decoding steps (KV and recurrent caches) give the residuals a full forward over the
    generated sequence gives at those positions."""
    last = model.cfg.n_layers - 1
    steps: list[torch.Tensor] = []

    def keep(resid, hook):
        steps.append(resid[:, -1].detach().clone())

    out = model.generate(inputs, max_new_tokens=max_new_tokens, fwd_hooks=[(f"blocks.{last}.hook_resid_post", keep)])
    new = out.tokens[:, : out.tokens.shape[1] - 1]
    types = None if inputs.mm_token_type_ids is None else torch.cat([inputs.mm_token_type_ids,
                                                                      torch.zeros_like(new)], 1)
    full = model.coerce_inputs(input_ids=torch.cat([inputs.input_ids, new], 1),
                               attention_mask=torch.cat([inputs.attention_mask, torch.ones_like(new)], 1),
                               pixel_values=inputs.pixel_values, image_grid_thw=inputs.image_grid_thw,
                               mm_token_type_ids=types)
    _, cache = model.run_with_cache(full, names_filter=f"blocks.{last}.hook_resid_post")
    resid = cache[f"blocks.{last}.hook_resid_post"]
    seq = inputs.seq_len
    for i, step in enumerate(steps):
        torch.testing.assert_close(step, resid[:, seq - 1 + i], atol=1e-4, rtol=0, msg=f"decoding step {i}")

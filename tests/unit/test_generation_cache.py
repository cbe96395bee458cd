"""generate(return_cache=True): one cache over prompt + new tokens equal to a forward over them, on every
family; hooks that read the decoding step (hook.ctx["step"]) patch exactly one step."""

from __future__ import annotations

import contextlib

import pytest
import torch

from tests.helpers.models import FAMILIES, tiny_vlm
from vlens.core.generation import continuation_inputs
from vlens.testing import random_image
from vlens.utils.errors import UserInputError


@contextlib.contextmanager
def plain_tokens_only(model):
    """Greedy decoding never picks a special token (a generated image placeholder would make a forward over
    prompt + output look for an image): their unembedding rows are 0 inside the block (restored after;
    with tied embeddings the embeddings too, for generation and reference alike)."""
    ids = set(model.tokenizer.all_special_ids)
    ids |= {t for t in (model.cfg.image_token_id, model.cfg.video_token_id) if t is not None}
    weight = model.unembed.lm_head.weight
    rows = sorted(i for i in ids if i < weight.shape[0])  # Molmo 2's image tokens lie past the output vocabulary
    saved = weight.data[rows].clone()
    weight.data[rows] = 0
    try:
        yield
    finally:
        weight.data[rows] = saved


def padded_batch(model):
    """Two rows of different lengths (left padding), each with an image of its own size."""
    return model.prepare(images=[random_image(60, 44, 1), random_image(50, 70, 2)],
                         prompts=["How many dots are there?", "red"])


def assert_cache_equals_forward(model, inputs, out, atol=1e-4, rel=None):
    """Every cached hook equals run_with_cache over prompt + new tokens at the real positions (padding
    positions see no key: HF eager gives them a uniform average whose width grows with the sequence)."""
    full = continuation_inputs(model, inputs, out.tokens)
    assert torch.equal(full.input_ids.cpu(), out.sequences.cpu())
    assert torch.equal(full.attention_mask.cpu(), out.attention_mask.cpu())
    _, ref = model.run_with_cache(full, names_filter=list(out.cache.keys()))
    real = full.attention_mask.bool()
    for name in ref.keys():
        ours, theirs = out.cache[name].float(), ref[name].float()
        assert ours.shape == theirs.shape, name
        if not (name.startswith("vision.") or name.endswith("hook_deepstack")):
            if name.endswith(("hook_pattern", "hook_attn_scores")):
                ours, theirs = ours.transpose(1, 2), theirs.transpose(1, 2)
            ours, theirs = ours[real], theirs[real]
        if rel is None:
            torch.testing.assert_close(ours, theirs, atol=atol, rtol=0, msg=name)
        else:  # bf16: the decode step's kernels round differently from the full forward's
            error = ((ours - theirs).norm() / theirs.norm().clamp_min(1e-6)).item()
            assert error < rel, (name, error)


@pytest.mark.parametrize("family", FAMILIES)
def test_cache_over_prompt_and_output_equals_a_forward(family):
    model = tiny_vlm(family)
    inputs = padded_batch(model)
    with plain_tokens_only(model):
        out = model.generate(inputs, max_new_tokens=4, return_cache=True, stop_at_eos=False)
        assert out.cache["hook_embed"].shape[1] == inputs.seq_len + 4  # the last new token included
        _, every = model.run_with_cache(inputs)
        assert set(out.cache.keys()) == set(every.keys())  # the default filter is run_with_cache's
        assert_cache_equals_forward(model, inputs, out)


def test_rows_finishing_at_different_steps():
    model = tiny_vlm("qwen2_5_vl")
    inputs = padded_batch(model)
    with plain_tokens_only(model):
        plain = model.generate(inputs, max_new_tokens=5, stop_at_eos=False)
        end = int(plain.tokens[0, 1])  # row 0 ends after its 2nd token; row 1 later or never
        assert end not in plain.tokens[1, :2].tolist()
        out = model.generate(inputs, max_new_tokens=5, return_cache=True, eos_token_id=end,
                             names_filter=lambda n: "blocks.1." in n or n.startswith("hook_"))
        assert out.tokens.shape[1] > 2 and int(out.tokens[0, 1]) == end
        assert "blocks.0.hook_resid_post" not in out.cache.keys()
        assert_cache_equals_forward(model, inputs, out)


def test_attention_scores_and_a_list_filter():
    model = tiny_vlm("llava")
    inputs = padded_batch(model)
    names = ["blocks.1.attn.hook_attn_scores", "blocks.1.attn.hook_pattern", "blocks.0.hook_resid_post"]
    with plain_tokens_only(model):
        out = model.generate(inputs, max_new_tokens=3, return_cache=True, stop_at_eos=False, names_filter=names)
        _, ref = model.run_with_cache(continuation_inputs(model, inputs, out.tokens), names_filter=names)
    assert sorted(out.cache.keys()) == sorted(names)
    real = out.attention_mask.bool()
    for name in names:  # masked scores hold the mask value in both
        ours, theirs = out.cache[name], ref[name]
        if "attn" in name:
            ours, theirs = ours.transpose(1, 2), theirs.transpose(1, 2)
        torch.testing.assert_close(ours[real], theirs[real], atol=1e-4, rtol=0)


def test_bf16_within_rounding():
    model = tiny_vlm("qwen2_5_vl", fresh=True).to(torch.bfloat16)
    inputs = padded_batch(model)
    with plain_tokens_only(model):
        out = model.generate(inputs, max_new_tokens=4, return_cache=True, stop_at_eos=False)
        assert out.cache["blocks.1.hook_resid_post"].dtype == torch.bfloat16
        assert_cache_equals_forward(model, inputs, out, rel=3e-2)


def test_hooks_see_the_step_and_patch_only_that_step():
    model = tiny_vlm("qwen2_vl")
    inputs = padded_batch(model)
    seen = []
    name, step = "blocks.0.hook_resid_post", 1
    push = torch.randn(model.cfg.d_model, generator=torch.Generator().manual_seed(0)) * 20

    def watch(x, hook):
        seen.append((hook.ctx["step"], hook.ctx["pos_offset"], x.shape[1]))

    def patch_at_step(x, hook):
        if hook.ctx["step"] == step:
            x[:, -1] += push
        return x

    with plain_tokens_only(model):
        plain = model.generate(inputs, max_new_tokens=4, stop_at_eos=False, fwd_hooks=[(name, watch)])
        p = inputs.seq_len
        assert seen == [(-1, 0, p), (0, p, 1), (1, p + 1, 1), (2, p + 2, 1)]
        patched = model.generate(inputs, max_new_tokens=4, stop_at_eos=False, return_cache=True,
                                 fwd_hooks=[(name, patch_at_step)])
        # the tokens up to the patched step's input are the plain ones; the next one is what a forward
        # over them, patched at that position, predicts
        assert torch.equal(patched.tokens[:, :step + 1], plain.tokens[:, :step + 1])

        def patch_last(x, hook):
            x[:, -1] += push
            return x

        prefix = continuation_inputs(model, inputs, patched.tokens[:, :step + 1])
        with model.hooks(fwd_hooks=[(name, patch_last)]):
            logits, ref = model.run_with_cache(prefix, names_filter=[name])
    assert torch.equal(logits[:, -1].argmax(-1), patched.tokens[:, step + 1])
    real = prefix.attention_mask.bool()
    torch.testing.assert_close(patched.cache[name][:, :p + step + 1][real], ref[name][real], atol=1e-4, rtol=0)
    assert not any("step" in hp.ctx for hp in model.hook_dict.values())


def test_a_failing_hook_leaves_no_hook_and_no_step():
    model = tiny_vlm("qwen2_vl")
    inputs = padded_batch(model)

    def boom(x, hook):
        if hook.ctx["step"] == 1:
            raise RuntimeError("hook failed")

    with pytest.raises(RuntimeError, match="hook failed"):
        model.generate(inputs, max_new_tokens=4, stop_at_eos=False, return_cache=True,
                       fwd_hooks=[("blocks.1.hook_resid_pre", boom)])
    assert [n for n, hp in model.hook_dict.items() if hp.fwd_hooks] == []
    assert not any("step" in hp.ctx or "pos_offset" in hp.ctx for hp in model.hook_dict.values())


def test_bad_requests_are_refused():
    model = tiny_vlm("qwen2_vl")
    inputs = padded_batch(model)
    with pytest.raises(UserInputError, match="return_cache=True"):
        model.generate(inputs, max_new_tokens=2, names_filter="hook_embed")
    with pytest.raises(UserInputError, match="use_past_kv_cache"):
        model.generate(inputs, max_new_tokens=2, return_cache=True, use_past_kv_cache=False)
    with pytest.raises(UserInputError, match="selects no hook"):
        model.generate(inputs, max_new_tokens=2, return_cache=True, names_filter=lambda n: False)
    with pytest.raises(UserInputError, match="unknown hooks"):
        model.generate(inputs, max_new_tokens=2, return_cache=True, names_filter=["blocks.0.hook_nope"])
    with pytest.raises(UserInputError, match="return_type"):
        model.generate(inputs, max_new_tokens=2, return_cache=True, return_type="tokens")
    with pytest.raises(UserInputError, match="placeholder"):
        continuation_inputs(model, inputs, torch.full((2, 1), model.cfg.image_token_id))

"""Qwen3-VL in HookedVLM: the parity matrix against HF eager on several tiny shapes, plus DeepStack."""

from __future__ import annotations

import functools

import pytest
import torch

from tests.helpers.arch_parity import (
    assert_generate_matches_hf,
    assert_head_decomposition,
    assert_hook_shapes,
    assert_hook_z_edit_matches_hf,
    assert_logits_match,
    assert_no_hooks_left_after_exception,
    assert_saved_checkpoint_loads,
    assert_scores_edit_matches_scaling_q,
    hf_logits,
    input_matrix,
)
from vlens.testing import random_image

# head counts, GQA ratios, head sizes (independent of d_model), M-RoPE sections, DeepStack layers, biases
SHAPES = {
    "gqa2_bias_deepstack01": dict(n_heads=4, n_kv_heads=2, d_head=24, mrope_section=[4, 4, 4], attention_bias=True,
                                  deepstack_visual_indexes=[0, 1]),
    "gqa6_one_deepstack": dict(d_model=48, n_heads=6, n_kv_heads=1, d_head=16, mrope_section=[2, 3, 3],
                               deepstack_visual_indexes=[2], vision_heads=4),
    "mha_three_deepstack": dict(n_heads=2, n_kv_heads=2, d_head=32, mrope_section=[8, 4, 4],
                                deepstack_visual_indexes=[0, 1, 2], vision_depth=3),
}


@functools.lru_cache(maxsize=4)
def _pair(shape: str):
    from vlens import HookedVLM
    from vlens.testing import tiny_qwen3_vl_model, tiny_qwen3_vl_processor

    hf = tiny_qwen3_vl_model(seed=len(shape), **SHAPES[shape])
    return hf, HookedVLM.from_hf(hf, processor=tiny_qwen3_vl_processor())


def _cases(model) -> dict:
    return input_matrix(model, [(64, 64), (96, 64), (64, 128), (64, 64), (96, 96), (64, 96)])


@pytest.mark.parametrize("shape", list(SHAPES))
def test_logits_match_hf_eager(shape):
    hf, model = _pair(shape)
    assert model.cfg.rope_kind == "mrope_interleaved" and model.cfg.qk_norm
    assert model.cfg.d_head == SHAPES[shape]["d_head"]
    assert_logits_match(model, hf, _cases(model))


def test_config_reads_head_dim_bias_and_deepstack():
    hf, model = _pair("gqa2_bias_deepstack01")
    c = model.cfg
    assert (c.n_heads, c.n_key_value_heads, c.d_head, c.d_model) == (4, 2, 24, 64)
    assert c.attn_qkv_bias and c.attn_out_bias and c.n_deepstack_layers == 2
    assert model.blocks[0].attn.b_O.abs().sum() > 0  # o_proj bias is the HF one
    assert model.W_Q.shape == (3, 4, 64, 24) and model.W_O.shape == (3, 4, 24, 64)


def test_hook_shapes_and_deepstack_hooks():
    hf, model = _pair("gqa2_bias_deepstack01")
    inputs = _cases(model)["left_padded_batch"]
    cache = assert_hook_shapes(model, inputs)
    n_img = sum(len(r) for r in inputs.regions.image)
    assert tuple(cache["blocks.0.hook_deepstack"].shape) == (n_img, model.cfg.d_model)
    assert tuple(cache["blocks.1.hook_deepstack"].shape) == (n_img, model.cfg.d_model)
    assert "blocks.2.hook_deepstack" not in cache.cache_dict  # only layers 0..k-1 receive features
    n_patches = int(inputs.image_grid_thw.prod(-1).sum())
    assert tuple(cache["vision.blocks.0.hook_resid_post"].shape) == (n_patches, 32)
    assert tuple(cache["vision.blocks.2.attn.hook_z"].shape) == (n_patches, 2, 16)


@pytest.mark.parametrize("shape", ["gqa2_bias_deepstack01", "gqa6_one_deepstack"])
def test_head_decomposition(shape):
    hf, model = _pair(shape)
    assert_head_decomposition(model, _cases(model)["left_padded_batch"])


@pytest.mark.parametrize("shape", ["gqa2_bias_deepstack01", "gqa6_one_deepstack"])
def test_hook_z_edit_equals_hf_o_proj_input_edit(shape):
    hf, model = _pair(shape)
    assert_hook_z_edit_matches_hf(model, hf, _cases(model)["left_padded_batch"], layer=1, head=1)


@pytest.mark.parametrize("shape", list(SHAPES))
def test_attn_scores_edit_equals_scaling_q_after_q_norm(shape):
    hf, model = _pair(shape)
    assert_scores_edit_matches_scaling_q(model, hf, _cases(model)["left_padded_batch"], layer=0, head=1)


def test_scaling_q_before_the_norm_does_nothing():
    """Why temperature edits must act after the q norm: RMSNorm undoes a per-head scale of q_proj's output."""
    hf, model = _pair("gqa2_bias_deepstack01")
    inputs = _cases(model)["one_image"]
    d_head = model.cfg.d_head

    def scale_hook_q(q, hook):
        return q * 3.0

    with torch.no_grad():
        plain = model(inputs)
        scaled = model.run_with_hooks(inputs, fwd_hooks=[("blocks.0.attn.hook_q", scale_hook_q)])
    # RMSNorm(3q) = RMSNorm(q) up to eps: the logits barely move
    assert (scaled - plain).abs().max() < 1e-3
    assert d_head == model.blocks[0].attn.q_norm.weight.shape[0]


def test_zeroing_deepstack_equals_hf_with_deepstack_mergers_zeroed():
    hf, model = _pair("gqa2_bias_deepstack01")
    inputs = _cases(model)["left_padded_batch"]
    zero = [(lambda name: name.endswith("hook_deepstack"), lambda x, hook: torch.zeros_like(x))]
    zero_mergers = [(m, lambda mod, args, out: torch.zeros_like(out)) for m in hf.model.visual.deepstack_merger_list]
    expected = hf_logits(hf, inputs, forward_hooks=zero_mergers)
    with torch.no_grad():
        ours = model.run_with_hooks(inputs, fwd_hooks=zero)
        plain = model(inputs)
    torch.testing.assert_close(ours, expected, atol=1e-4, rtol=0)
    assert (ours - plain).abs().max() > 1e-4  # DeepStack matters in this model


def test_deepstack_patch_moves_features_between_runs():
    """Caching hook_deepstack on one image and patching it into another equals HF with those features."""
    hf, model = _pair("gqa2_bias_deepstack01")
    a = model.prepare(images=[random_image(64, 64, 11)], prompts=["How many dots are there?"])
    b = model.prepare(images=[random_image(64, 64, 12)], prompts=["How many dots are there?"])
    _, cache_a = model.run_with_cache(a, names_filter=lambda n: n.endswith("hook_deepstack"))
    patch = [(f"blocks.{layer}.hook_deepstack", lambda x, hook: cache_a[hook.name]) for layer in range(2)]
    feats_a = [cache_a[f"blocks.{layer}.hook_deepstack"] for layer in range(2)]
    set_mergers = [(m, lambda mod, args, out, f=f: f)
                   for m, f in zip(hf.model.visual.deepstack_merger_list, feats_a, strict=True)]
    expected = hf_logits(hf, b, forward_hooks=set_mergers)
    with torch.no_grad():
        ours = model.run_with_hooks(b, fwd_hooks=patch)
    torch.testing.assert_close(ours, expected, atol=1e-4, rtol=0)


@pytest.mark.parametrize("case", ["left_padded_batch", "two_images_different_sizes", "text_only",
                                  "mixed_batch_with_text_only_row"])
def test_greedy_generate_matches_hf(case):
    hf, model = _pair("gqa2_bias_deepstack01")
    assert_generate_matches_hf(model, hf, _cases(model)[case])


def test_vision_head_hooks_edit_the_tower():
    hf, model = _pair("gqa2_bias_deepstack01")
    inputs = _cases(model)["one_image"]
    heads = hf.model.visual.config.num_heads

    def drop_head(z, hook):
        z = z.clone()
        z[:, 1] = 0
        return z

    def drop_head_hf(module, args):
        x = args[0].clone()
        x[..., x.shape[-1] // heads:] = 0
        return (x,)

    expected = hf_logits(hf, inputs, pre_hooks=[(hf.model.visual.blocks[1].attn.proj, drop_head_hf)])
    with torch.no_grad():
        ours = model.run_with_hooks(inputs, fwd_hooks=[("vision.blocks.1.attn.hook_z", drop_head)])
    torch.testing.assert_close(ours, expected, atol=1e-4, rtol=0)


def test_no_hooks_left_after_exception():
    hf, model = _pair("gqa2_bias_deepstack01")
    assert_no_hooks_left_after_exception(model, _cases(model)["one_image"],
                                         ["blocks.0.hook_deepstack", "blocks.1.attn.hook_pattern",
                                          "vision.blocks.0.attn.hook_z"])


def test_saved_checkpoint_loads_with_its_processor(tmp_path):
    hf, model = _pair("gqa6_one_deepstack")
    assert_saved_checkpoint_loads(hf, model.processor, tmp_path, [random_image(64, 64, 1), random_image(96, 64, 2)])

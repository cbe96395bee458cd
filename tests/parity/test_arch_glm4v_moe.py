"""GLM-4.5V (GLM-4V-MoE) in HookedVLM: the parity matrix against HF eager on tiny shapes unlike the released ones
(experts, groups, top-k, shared experts, dense layers, head sizes, rotary fractions), the grouped sigmoid routing,
and edits on the router, the experts and the shared experts made on both sides."""

from __future__ import annotations

import functools

import pytest
import torch

from tests.helpers.arch_parity import (
    assert_bf16_within_hf_noise,
    assert_generate_matches_hf,
    assert_head_decomposition,
    assert_hook_z_edit_matches_hf,
    assert_logits_match,
    assert_no_hooks_left_after_exception,
    assert_saved_checkpoint_loads,
    assert_scores_edit_matches_scaling_q,
    hf_logits,
    input_matrix,
)
from tests.helpers.moe_parity import (
    assert_close_and_moved,
    assert_expert_out_scale_matches_hf,
    assert_router_scale_matches_hf,
    assert_routing_edits_match_hf,
    experts_by_use,
    ours,
)
from vlens.testing import random_image

SHAPES = {
    # 8 experts in 2 groups (1 kept), top 2, one shared expert, one dense layer first, half the head rotated
    "e8_g2_top2_shared1": dict(model=dict(d_model=48, n_heads=4, n_kv_heads=2, d_mlp=56, n_experts=8, top_k=2,
                                          d_expert=20, n_group=2, topk_group=1, n_shared_experts=1),
                               processor=dict()),
    # 6 experts in 3 groups (2 kept), top 3 unnormalised and scaled, 2 shared experts, head_dim unlike d_model /
    # n_heads, the whole head rotated, no dense layer, 7 px patches
    "e6_g3_top3_headdim": dict(model=dict(d_model=40, n_heads=5, n_kv_heads=1, head_dim=12, d_mlp=44, n_experts=6,
                                          top_k=3, d_expert=16, n_group=3, topk_group=2, n_shared_experts=2,
                                          first_k_dense_replace=0, norm_topk_prob=False, routed_scaling_factor=2.5,
                                          partial_rotary_factor=1.0, attention_bias=False, patch_size=7,
                                          vision_image_size=28),
                               processor=dict(patch_size=7, min_pixels=28 * 28, max_pixels=70 * 70)),
}
SIZES = [(40, 70), (90, 30), (33, 47), (64, 64), (50, 20), (28, 96)]


@functools.lru_cache(maxsize=2)
def _pair(shape: str):
    from vlens import HookedVLM
    from vlens.testing import tiny_glm4v_moe_model, tiny_glm4v_processor

    spec = SHAPES[shape]
    hf = tiny_glm4v_moe_model(seed=len(shape), **spec["model"])
    return hf, HookedVLM.from_hf(hf, processor=tiny_glm4v_processor(**spec["processor"]))


@functools.lru_cache(maxsize=2)
def _cases(shape: str) -> dict:
    return input_matrix(_pair(shape)[1], SIZES)


@pytest.mark.parametrize("shape", list(SHAPES))
def test_logits_match_hf_eager(shape):
    hf, model = _pair(shape)
    assert model.adapter.family == "glm4v_moe" and not model.cfg.rope_adjacent_pairs
    assert_logits_match(model, hf, _cases(shape))


def test_config_and_layers():
    _, model = _pair("e8_g2_top2_shared1")
    c = model.cfg
    assert (c.n_experts, c.n_experts_per_token, c.d_expert, c.d_shared_expert, c.moe_layers) == (8, 2, 20, 20, [1])
    assert [type(b.mlp).__name__ for b in model.blocks] == ["GatedMLP", "GroupedSigmoidMoEMLP"]
    _, model = _pair("e6_g3_top3_headdim")
    assert model.cfg.d_head == 12 and model.cfg.moe_layers == [0, 1] and model.cfg.d_shared_expert == 32


@pytest.mark.parametrize("shape", list(SHAPES))
def test_routing_is_hfs_router(shape):
    """The chosen experts and weights are HF's router outputs (sigmoid scores with the choice bias, best groups,
    scaled weights); the MLP output is the weighted experts plus the shared experts."""
    hf, model = _pair(shape)
    inputs = _cases(shape)["left_padded_batch"]
    layer = model.cfg.moe_layers[-1]
    seen = {}
    router = model.adapter.language_model(hf).layers[layer].mlp.gate
    handle = router.register_forward_hook(lambda m, a, out: seen.setdefault("out", out))
    try:
        hf_logits(hf, inputs)
    finally:
        handle.remove()
    _, cache = model.run_with_cache(inputs, names_filter=lambda n: n.startswith(f"blocks.{layer}."))
    mlp = f"blocks.{layer}.mlp"
    _, weights, indices = seen["out"]
    flat = cache[f"{mlp}.hook_expert_indices"].reshape(-1, model.blocks[layer].mlp.top_k)
    torch.testing.assert_close(cache[f"{mlp}.hook_expert_weights"].reshape(weights.shape), weights)
    assert torch.equal(flat, indices)
    routed = (cache[f"{mlp}.hook_expert_out"] * cache[f"{mlp}.hook_expert_weights"][..., None]).sum(2)
    torch.testing.assert_close(routed + cache[f"{mlp}.hook_shared_out"], cache[f"blocks.{layer}.hook_mlp_out"],
                               atol=1e-5, rtol=0)


@pytest.mark.parametrize("shape", list(SHAPES))
def test_router_expert_and_shared_edits_equal_hf_edits(shape):
    hf, model = _pair(shape)
    inputs = _cases(shape)["left_padded_batch"]
    layer = model.cfg.moe_layers[-1]
    used = experts_by_use(model, inputs, layer)
    assert_router_scale_matches_hf(model, hf, inputs, layer, used[-1], scale=8.0)
    assert_expert_out_scale_matches_hf(model, hf, inputs, layer, used[0])
    assert_routing_edits_match_hf(model, hf, inputs, layer)
    shared = model.adapter.language_model(hf).layers[layer].mlp.shared_experts
    got = ours(model, inputs, [(f"blocks.{layer}.mlp.hook_shared_out", lambda x, hook: torch.zeros_like(x))])
    expected = hf_logits(hf, inputs, forward_hooks=[(shared, lambda m, a, out: torch.zeros_like(out))])
    assert_close_and_moved(got, expected, ours(model, inputs, []), "shared experts zeroed")


@pytest.mark.parametrize("shape", list(SHAPES))
def test_attention_hooks_and_edits(shape):
    hf, model = _pair(shape)
    inputs = _cases(shape)["left_padded_batch"]
    assert_head_decomposition(model, inputs)
    assert_hook_z_edit_matches_hf(model, hf, inputs, layer=1, head=1)
    assert_scores_edit_matches_scaling_q(model, hf, inputs, layer=0, head=0)


@pytest.mark.parametrize("shape,case", [("e8_g2_top2_shared1", "left_padded_batch"),
                                        ("e8_g2_top2_shared1", "two_images_different_sizes"),
                                        ("e6_g3_top3_headdim", "mixed_batch_with_text_only_row")])
def test_greedy_generate_matches_hf(shape, case):
    hf, model = _pair(shape)
    assert_generate_matches_hf(model, hf, _cases(shape)[case])


def test_bf16_within_hf_bf16_noise():
    hf, model = _pair("e8_g2_top2_shared1")
    assert_bf16_within_hf_noise(hf, model.processor, lambda m: m.prepare(
        images=[random_image(50, 30, 1), random_image(30, 44, 2)], prompts=["How many dots are there?", "red"]))


def test_no_hooks_left_and_checkpoint_loads(tmp_path):
    hf, model = _pair("e6_g3_top3_headdim")
    assert_no_hooks_left_after_exception(model, _cases("e6_g3_top3_headdim")["one_image"],
                                         ["blocks.1.mlp.hook_router_logits", "blocks.0.mlp.hook_shared_out",
                                          "vision.hook_image_features", "blocks.1.attn.hook_pattern"])
    assert_saved_checkpoint_loads(hf, model.processor, tmp_path, [random_image(70, 40, 1), random_image(30, 64, 2)])

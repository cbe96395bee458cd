"""Qwen3.5-MoE in HookedVLM: the hybrid decoder with routed + shared experts, against HF eager."""

from __future__ import annotations

import pytest

from tests.helpers.arch_parity import (
    assert_generate_matches_hf,
    assert_hook_z_edit_matches_hf,
    assert_logits_match,
    assert_saved_checkpoint_loads,
)
from tests.helpers.moe_parity import (
    TinyPairs,
    assert_decoding_equals_full_forward,
    assert_expert_out_scale_matches_hf,
    assert_layer_head_decomposition,
    assert_moe_decomposition,
    assert_router_scale_matches_hf,
    assert_routing_edits_match_hf,
    assert_shared_expert_edit_matches_hf,
    experts_by_use,
)
from vlens.testing import random_image

SHAPES = {
    "e5_top2_shared": dict(n_layers=3, d_model=44, n_heads=2, n_kv_heads=1, d_head=20, linear_heads=3,
                           linear_key_heads=1, linear_d_head=14, linear_d_key=12, n_experts=5, top_k=2, d_expert=18,
                           d_shared_expert=26, partial_rotary_factor=0.4),
    "e8_top3_full_last": dict(n_layers=2, d_model=36, n_heads=4, n_kv_heads=2, d_head=12, linear_heads=2,
                              linear_key_heads=2, linear_d_head=16, linear_d_key=8, n_experts=8, top_k=3,
                              d_expert=10, d_shared_expert=12, conv_kernel=2),
}


PAIRS = TinyPairs("tiny_qwen3_5_moe_model", SHAPES)
_pair, _cases = PAIRS.pair, PAIRS.cases


@pytest.mark.parametrize("shape", list(SHAPES))
def test_logits_match_hf_eager(shape):
    hf, model = _pair(shape)
    assert_logits_match(model, hf, _cases(shape))
    assert model.cfg.moe_layers == list(range(model.cfg.n_layers)) and model.cfg.d_shared_expert > 0


@pytest.mark.parametrize("shape", list(SHAPES))
def test_expert_and_head_edits_equal_hf_edits(shape):
    hf, model = _pair(shape)
    inputs = _cases(shape)["left_padded_batch"]
    assert_layer_head_decomposition(model, inputs)
    for layer in range(model.cfg.n_layers):
        assert_moe_decomposition(model, inputs, layer)
    layer = model.cfg.linear_attention_layers[0]
    used = experts_by_use(model, inputs, layer)
    assert_router_scale_matches_hf(model, hf, inputs, layer, expert=used[0], scale=-3.0)
    assert_expert_out_scale_matches_hf(model, hf, inputs, layer, expert=used[1])
    assert_routing_edits_match_hf(model, hf, inputs, layer)
    assert_shared_expert_edit_matches_hf(model, hf, inputs, layer)
    assert_hook_z_edit_matches_hf(model, hf, inputs, layer, head=1)
    full = next(x for x in range(model.cfg.n_layers) if not model.cfg.is_linear_attention(x))
    assert_hook_z_edit_matches_hf(model, hf, inputs, full, head=1)


@pytest.mark.parametrize("case", ["left_padded_batch", "two_images_different_sizes", "text_only"])
def test_greedy_generate_matches_hf(case):
    hf, model = _pair("e5_top2_shared")
    assert_generate_matches_hf(model, hf, _cases("e5_top2_shared")[case], max_new_tokens=6)


def test_cached_decoding_equals_a_full_forward():
    _, model = _pair("e8_top3_full_last")
    assert_decoding_equals_full_forward(model, _cases("e8_top3_full_last")["mixed_batch_with_text_only_row"])


def test_saved_checkpoint_loads_with_its_processor(tmp_path):
    hf, model = _pair("e8_top3_full_last")
    assert_saved_checkpoint_loads(hf, model.processor, tmp_path, [random_image(64, 64, 1), random_image(96, 64, 2)])


def test_bfloat16_explicit_path_equals_hf_eager():
    """In bf16 the explicit attention path (pattern hooked) is HF eager's arithmetic: zero-centred norms and
    the final norm in fp32 until 1 + w is applied, experts summed in HF's order, HF's delta-rule kernels."""
    import torch

    from vlens import HookedVLM
    from vlens.testing import random_image, tiny_qwen3_5_moe_model, tiny_qwen3_vl_processor

    hf = tiny_qwen3_5_moe_model(seed=2, dtype=torch.bfloat16, **SHAPES["e5_top2_shared"])
    model = HookedVLM.from_hf(hf, processor=tiny_qwen3_vl_processor())
    inputs = model.prepare(images=[random_image(64, 64, 1), random_image(96, 64, 2)], prompts=["How many dots?", "red"])
    with torch.no_grad():
        ours = model.run_with_hooks(inputs, fwd_hooks=[(lambda n: n.endswith("hook_pattern"), lambda x, hook: x)])
        expected = hf(**inputs.to_hf_kwargs()).logits
    real = inputs.attention_mask.bool()
    assert ours.dtype == torch.bfloat16
    torch.testing.assert_close(ours[real].float(), expected[real].float(), atol=1e-3, rtol=0)  # < one bf16 ulp

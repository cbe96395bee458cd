"""Qwen3-VL-MoE in HookedVLM: logits, generation and hook edits (router, experts) against HF eager."""

from __future__ import annotations

import pytest
import torch

from tests.helpers.arch_parity import (
    assert_generate_matches_hf,
    assert_head_decomposition,
    assert_hook_z_edit_matches_hf,
    assert_logits_match,
    assert_no_hooks_left_after_exception,
    assert_saved_checkpoint_loads,
    assert_scores_edit_matches_scaling_q,
)
from tests.helpers.moe_parity import (
    TinyPairs,
    assert_decoding_equals_full_forward,
    assert_expert_out_scale_matches_hf,
    assert_moe_decomposition,
    assert_router_scale_matches_hf,
    assert_routing_edits_match_hf,
    experts_by_use,
)
from vlens.testing import random_image

# sizes unlike the defaults: experts, top-k, dense layers among sparse ones, GQA ratios, head sizes, DeepStack
SHAPES = {
    "e7_top3_dense_middle": dict(n_layers=3, d_model=40, n_heads=5, n_kv_heads=1, d_head=12, d_mlp=44,
                                 mrope_section=[2, 2, 2], n_experts=7, top_k=3, d_expert=18, mlp_only_layers=[1],
                                 deepstack_visual_indexes=[0, 1]),
    "e4_top1_sparse_step2": dict(n_layers=4, d_model=36, n_heads=3, n_kv_heads=3, d_head=20, d_mlp=30,
                                 mrope_section=[4, 3, 3], n_experts=4, top_k=1, d_expert=14, decoder_sparse_step=2,
                                 deepstack_visual_indexes=[1], attention_bias=True),
}


PAIRS = TinyPairs("tiny_qwen3_vl_moe_model", SHAPES)
_pair, _cases = PAIRS.pair, PAIRS.cases


@pytest.mark.parametrize("shape", list(SHAPES))
def test_logits_match_hf_eager(shape):
    hf, model = _pair(shape)
    assert_logits_match(model, hf, _cases(shape))


def test_config_names_the_moe_layers():
    _, model = _pair("e7_top3_dense_middle")
    c = model.cfg
    assert (c.n_experts, c.n_experts_per_token, c.d_expert, c.moe_layers) == (7, 3, 18, [0, 2])
    assert type(model.blocks[1].mlp).__name__ == "GatedMLP" and type(model.blocks[0].mlp).__name__ == "MoEMLP"
    _, model = _pair("e4_top1_sparse_step2")
    assert model.cfg.moe_layers == [1, 3]


def test_experts_are_the_hf_parameters():
    hf, model = _pair("e7_top3_dense_middle")
    mlp, hf_mlp = model.blocks[0].mlp, hf.model.language_model.layers[0].mlp
    assert mlp.experts.gate_up_proj is hf_mlp.experts.gate_up_proj and mlp.router.weight is hf_mlp.gate.weight
    gate, up, down = mlp.expert_weights(2)
    assert gate.shape == up.shape == (40, 18) and down.shape == (18, 40)
    fused = hf_mlp.experts.gate_up_proj
    assert gate.untyped_storage().data_ptr() == fused.untyped_storage().data_ptr()  # views, not copies
    assert torch.equal(gate, fused[2, :18].T) and torch.equal(up, fused[2, 18:].T)


@pytest.mark.parametrize("shape", list(SHAPES))
def test_moe_hooks_decompose_the_mlp_output(shape):
    _, model = _pair(shape)
    assert_moe_decomposition(model, _cases(shape)["left_padded_batch"], model.cfg.moe_layers[0])


@pytest.mark.parametrize("shape", list(SHAPES))
def test_router_and_expert_edits_equal_hf_edits(shape):
    hf, model = _pair(shape)
    inputs = _cases(shape)["left_padded_batch"]
    layer = model.cfg.moe_layers[-1]
    used = experts_by_use(model, inputs, layer)
    assert_router_scale_matches_hf(model, hf, inputs, layer, expert=used[0], scale=-3.0)  # re-routes
    assert_expert_out_scale_matches_hf(model, hf, inputs, layer, expert=used[0])
    assert_expert_out_scale_matches_hf(model, hf, inputs, layer, expert=used[1], scale=1.7)
    assert_routing_edits_match_hf(model, hf, inputs, layer)


def test_attention_edits_equal_hf_edits():
    hf, model = _pair("e7_top3_dense_middle")
    inputs = _cases("e7_top3_dense_middle")["left_padded_batch"]
    assert_head_decomposition(model, inputs)
    assert_hook_z_edit_matches_hf(model, hf, inputs, layer=2, head=3)
    assert_scores_edit_matches_scaling_q(model, hf, inputs, layer=0, head=4)


@pytest.mark.parametrize("case", ["left_padded_batch", "two_images_different_sizes", "text_only",
                                  "mixed_batch_with_text_only_row"])
def test_greedy_generate_matches_hf(case):
    hf, model = _pair("e7_top3_dense_middle")
    assert_generate_matches_hf(model, hf, _cases("e7_top3_dense_middle")[case], max_new_tokens=6)


def test_cached_decoding_equals_a_full_forward():
    _, model = _pair("e4_top1_sparse_step2")
    assert_decoding_equals_full_forward(model, _cases("e4_top1_sparse_step2")["left_padded_batch"])


def test_no_hooks_left_after_exception():
    _, model = _pair("e4_top1_sparse_step2")
    assert_no_hooks_left_after_exception(model, _cases("e4_top1_sparse_step2")["one_image"],
                                         ["blocks.1.mlp.hook_expert_out", "blocks.3.mlp.hook_router_logits"])


def test_saved_checkpoint_loads_with_its_processor(tmp_path):
    hf, model = _pair("e4_top1_sparse_step2")
    assert_saved_checkpoint_loads(hf, model.processor, tmp_path, [random_image(64, 64, 1), random_image(96, 64, 2)])
    assert torch.equal(model.blocks[1].mlp.experts.down_proj, hf.model.language_model.layers[1].mlp.experts.down_proj)


def test_neuron_views_refuse_mixture_of_experts_layers():
    _, model = _pair("e7_top3_dense_middle")
    with pytest.raises(ValueError, match="MoEMLP"):
        _ = model.W_in
    _, cache = model.run_with_cache(_cases("e7_top3_dense_middle")["one_image"])
    with pytest.raises(ValueError, match="expand_neurons=False"):
        cache.get_full_resid_decomposition()
    stack = cache.get_full_resid_decomposition(expand_neurons=False)
    torch.testing.assert_close(stack.sum(0), cache["blocks.2.hook_resid_post"], atol=1e-4, rtol=0)

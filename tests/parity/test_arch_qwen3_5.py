"""Qwen3.5 in HookedVLM (Gated DeltaNet + gated attention): logits, generation with the recurrent
cache, and hook edits on linear- and full-attention layers against HF eager."""

from __future__ import annotations

import pytest
import torch

from tests.helpers.arch_parity import (
    assert_generate_matches_hf,
    assert_hook_z_edit_matches_hf,
    assert_logits_match,
    assert_no_hooks_left_after_exception,
    assert_saved_checkpoint_loads,
    assert_scores_edit_matches_scaling_q,
)
from tests.helpers.moe_parity import (
    TinyPairs,
    assert_decoding_equals_full_forward,
    assert_layer_head_decomposition,
    assert_linear_gate_edits_match_hf,
    assert_linear_hook_shapes,
    assert_linear_value_edit_matches_hf,
    assert_output_gate_edit_matches_hf,
)
from vlens.testing import random_image

# head shapes of the two layer kinds independent of each other and of d_model; layer layouts; partial rotary
SHAPES = {
    "lin_full_lin": dict(n_layers=3, d_model=48, n_heads=3, n_kv_heads=1, d_head=16, linear_heads=4,
                         linear_key_heads=2, linear_d_head=12, linear_d_key=10, conv_kernel=3,
                         partial_rotary_factor=0.5),
    "full_first_wide_linear": dict(n_layers=4, d_model=40, n_heads=2, n_kv_heads=2, d_head=24, linear_heads=6,
                                   linear_key_heads=6, linear_d_head=8, linear_d_key=14, conv_kernel=4,
                                   partial_rotary_factor=0.25, attention_bias=True,
                                   layer_types=["full_attention", "linear_attention", "linear_attention",
                                                "full_attention"]),
}


PAIRS = TinyPairs("tiny_qwen3_5_model", SHAPES)
_pair, _cases = PAIRS.pair, PAIRS.cases


def _linear(model) -> int:
    return model.cfg.linear_attention_layers[-1]


def _full(model) -> int:
    return next(x for x in range(model.cfg.n_layers) if not model.cfg.is_linear_attention(x))


@pytest.mark.parametrize("shape", list(SHAPES))
def test_logits_match_hf_eager(shape):
    hf, model = _pair(shape)
    assert_logits_match(model, hf, _cases(shape))


@pytest.mark.parametrize("shape", list(SHAPES))
def test_logits_match_hf_with_the_recurrent_state_materialised(shape):
    """The token-by-token path (taken while hook_recurrent_state is hooked) gives HF's logits too."""
    hf, model = _pair(shape)
    for name in ("left_padded_batch", "two_images_different_sizes"):
        inputs = _cases(shape)[name]
        with torch.no_grad():
            got = model.run_with_hooks(inputs, fwd_hooks=[(lambda n: n.endswith("hook_recurrent_state"),
                                                           lambda s, hook: s)])
            torch.testing.assert_close(got, hf(**inputs.to_hf_kwargs()).logits, atol=1e-4, rtol=0)


def test_config_layer_types_and_head_shapes():
    _, model = _pair("lin_full_lin")
    c = model.cfg
    assert c.linear_attention_layers == [0, 2]
    assert [c.heads_at(x) for x in range(3)] == [4, 3, 4] and [c.d_head_at(x) for x in range(3)] == [12, 16, 12]
    assert c.max_heads == 4 and c.n_heads_total == 11 and not c.uniform_heads
    assert type(model.blocks[0].attn).__name__ == "GatedDeltaNet"
    assert type(model.blocks[1].attn).__name__ == "GatedAttention"
    assert model.blocks[1].attn.W_Q.shape == (3, 48, 16)


@pytest.mark.parametrize("shape", list(SHAPES))
def test_heads_decompose_the_attention_output_on_every_layer(shape):
    _, model = _pair(shape)
    assert_layer_head_decomposition(model, _cases(shape)["left_padded_batch"])


def test_linear_attention_hook_shapes():
    _, model = _pair("lin_full_lin")
    assert_linear_hook_shapes(model, _cases("lin_full_lin")["left_padded_batch"], layer=0)


@pytest.mark.parametrize("shape", list(SHAPES))
def test_linear_attention_edits_equal_hf_edits(shape):
    hf, model = _pair(shape)
    inputs = _cases(shape)["left_padded_batch"]
    layer = _linear(model)
    assert_hook_z_edit_matches_hf(model, hf, inputs, layer, head=1)
    assert_linear_gate_edits_match_hf(model, hf, inputs, layer, head=model.cfg.linear_n_heads - 1)
    assert_linear_value_edit_matches_hf(model, hf, inputs, layer, head=2)


@pytest.mark.parametrize("shape", list(SHAPES))
def test_full_attention_edits_equal_hf_edits(shape):
    hf, model = _pair(shape)
    inputs = _cases(shape)["left_padded_batch"]
    layer = _full(model)
    assert_hook_z_edit_matches_hf(model, hf, inputs, layer, head=1)
    assert_scores_edit_matches_scaling_q(model, hf, inputs, layer, head=0)
    assert_output_gate_edit_matches_hf(model, hf, inputs, layer, head=1)


@pytest.mark.parametrize("case", ["left_padded_batch", "two_images_different_sizes", "text_only",
                                  "mixed_batch_with_text_only_row"])
@pytest.mark.parametrize("shape", list(SHAPES))
def test_greedy_generate_matches_hf(shape, case):
    hf, model = _pair(shape)
    assert_generate_matches_hf(model, hf, _cases(shape)[case], max_new_tokens=6)


@pytest.mark.parametrize("shape", list(SHAPES))
def test_cached_decoding_equals_a_full_forward(shape):
    _, model = _pair(shape)
    assert_decoding_equals_full_forward(model, _cases(shape)["left_padded_batch"])


def test_left_padding_changes_no_real_position():
    """HF zeroes padding inputs of linear-attention layers: a padded row equals the row run alone."""
    _, model = _pair("lin_full_lin")
    batch = model.prepare(prompts=["How many dots are there?", "red"])
    alone = model.prepare(prompts=["red"])
    with torch.no_grad():
        padded, single = model(batch), model(alone)
    torch.testing.assert_close(padded[1, -single.shape[1]:], single[0], atol=1e-4, rtol=0)


def test_no_hooks_left_after_exception():
    _, model = _pair("lin_full_lin")
    assert_no_hooks_left_after_exception(model, _cases("lin_full_lin")["one_image"],
                                         ["blocks.0.attn.hook_recurrent_state", "blocks.1.attn.hook_pattern",
                                          "blocks.2.attn.hook_beta"])


def test_saved_checkpoint_loads_with_its_processor(tmp_path):
    hf, model = _pair("full_first_wide_linear")
    assert_saved_checkpoint_loads(hf, model.processor, tmp_path, [random_image(64, 64, 1), random_image(96, 64, 2)])


def test_stacked_weight_views_explain_what_differs_by_layer():
    """model.W_O cannot stack layers of different head shapes, nor model.W_Q a layer without queries:
    both say so and point to the per-layer views; TransformerLens's per-head stacking still adds up."""
    _, model = _pair("lin_full_lin")
    with pytest.raises(ValueError, match=r"model.blocks\[l\].attn.W_O"):
        _ = model.W_O
    with pytest.raises(ValueError, match="GatedDeltaNet"):
        _ = model.W_Q
    inputs = _cases("lin_full_lin")["one_image"]
    _, cache = model.run_with_cache(inputs)
    heads, labels = cache.stack_head_results(layer=-1, return_labels=True)
    assert len(labels) == model.cfg.n_heads_total
    attn = sum(cache[f"blocks.{layer}.hook_attn_out"] - model.blocks[layer].attn.b_O for layer in range(3))
    torch.testing.assert_close(heads.sum(0), attn, atol=1e-5, rtol=0)

"""Hook shapes, head decomposition, edits equal to HF-side edits, TL cache methods, hook hygiene."""

from __future__ import annotations

import pytest
import torch

from tests.helpers.arch_parity import (
    assert_head_decomposition,
    assert_hook_shapes,
    assert_hook_z_edit_matches_hf,
    assert_no_hooks_left_after_exception,
    assert_scores_edit_matches_scaling_q,
)
from tests.helpers.models import QWEN_FAMILIES
from vlens.testing import random_image


def _inputs(model):
    return model.prepare(images=[random_image(56, 56, 1), [random_image(84, 56, 2), random_image(56, 56, 3)]],
                         prompts=["How many dots are there?", "What colour"])


def test_hook_shapes(qwen_pair):
    hf, model = qwen_pair("qwen2_5_vl")
    inputs = _inputs(model)
    cache = assert_hook_shapes(model, inputs)
    assert cache["vision.blocks.0.hook_resid_post"].ndim == 2
    assert torch.allclose(cache["blocks.0.attn.hook_pattern"].sum(-1), torch.ones(()), atol=1e-5)


@pytest.mark.parametrize("family", QWEN_FAMILIES)
def test_head_decomposition_sums_to_attn_out(qwen_pair, family):
    hf, model = qwen_pair(family)
    assert_head_decomposition(model, _inputs(model))


def test_hook_result_sums_to_attn_out_and_keeps_logits(qwen_pair):
    hf, model = qwen_pair("qwen2_5_vl")
    inputs = _inputs(model)
    with torch.no_grad():
        plain = model(inputs)
    model.set_use_attn_result(True)
    logits, cache = model.run_with_cache(inputs)
    torch.testing.assert_close(logits, plain, atol=1e-5, rtol=0)
    for layer in range(model.cfg.n_layers):
        result = cache[f"blocks.{layer}.attn.hook_result"]
        torch.testing.assert_close(result.sum(2) + model.blocks[layer].attn.b_O,
                                   cache[f"blocks.{layer}.hook_attn_out"], atol=1e-5, rtol=0)


@pytest.mark.parametrize("family", QWEN_FAMILIES)
def test_hook_z_edit_equals_hf_o_proj_input_edit(qwen_pair, family):
    hf, model = qwen_pair(family)
    assert_hook_z_edit_matches_hf(model, hf, _inputs(model), layer=1, head=2)


@pytest.mark.parametrize("family", QWEN_FAMILIES)
def test_attn_scores_edit_equals_scaling_q_in_hf(qwen_pair, family):
    hf, model = qwen_pair(family)
    assert_scores_edit_matches_scaling_q(model, hf, _inputs(model), layer=0, head=1, beta=1.7)


def test_no_hook_left_after_exception_in_hook(qwen_pair):
    hf, model = qwen_pair("qwen2_5_vl")
    # the first name is also raised from inside generate
    assert_no_hooks_left_after_exception(model, _inputs(model), ["blocks.1.attn.hook_z", "blocks.0.attn.hook_pattern",
                                                                 "vision.blocks.0.hook_resid_post", "hook_embed"])


def test_vision_hooks_can_edit_the_tower(qwen_pair):
    hf, model = qwen_pair("qwen2_vl")
    inputs = _inputs(model)
    with torch.no_grad():
        plain = model(inputs)
        zeroed = model.run_with_hooks(inputs, fwd_hooks=[("vision.hook_image_embeds", lambda x, hook: x * 0)])
    assert (zeroed - plain).abs().max() > 1e-4
    captured = {}
    model.run_with_hooks(inputs, fwd_hooks=[("vision.blocks.1.hook_resid_post",
                                             lambda x, hook: captured.setdefault("x", x))])
    assert captured["x"].shape[0] == int(inputs.image_grid_thw.prod(-1).sum())  # one row per patch


def test_activation_cache_methods(qwen_pair):
    hf, model = qwen_pair("qwen2_5_vl")
    logits, cache = model.run_with_cache(_inputs(model))
    n_layers, n_heads = model.cfg.n_layers, model.cfg.n_heads
    heads = cache.stack_head_results(layer=-1)
    assert heads.shape[0] == n_layers * n_heads
    resid = cache.accumulated_resid()
    assert resid.shape[0] == n_layers + 1
    torch.testing.assert_close(resid[-1], cache[f"blocks.{n_layers - 1}.hook_resid_post"])
    components = cache.decompose_resid()
    # embeddings + attn + mlp per layer add up to the final residual
    torch.testing.assert_close(components.sum(0), cache[f"blocks.{n_layers - 1}.hook_resid_post"], atol=1e-4, rtol=0)
    # apply_ln_to_stack divides by the cached scale; the final norm's weight is folded into W_U
    normed = cache.apply_ln_to_stack(resid[-1:], layer=-1)[0]
    torch.testing.assert_close(normed @ model.W_U + model.b_U, logits, atol=1e-4, rtol=0)


def test_weight_views_have_transformer_lens_shapes(qwen_pair):
    hf, model = qwen_pair("qwen2_5_vl")
    c = model.cfg
    assert model.W_Q.shape == (c.n_layers, c.n_heads, c.d_model, c.d_head)
    assert model.W_K.shape == (c.n_layers, c.n_heads, c.d_model, c.d_head)
    assert model.W_V.shape == (c.n_layers, c.n_heads, c.d_model, c.d_head)
    assert model.W_O.shape == (c.n_layers, c.n_heads, c.d_head, c.d_model)
    assert model.b_Q.shape == (c.n_layers, c.n_heads, c.d_head)
    assert model.b_K.shape == (c.n_layers, c.n_heads, c.d_head)
    assert model.b_V.shape == (c.n_layers, c.n_heads, c.d_head)
    assert model.b_O.shape == (c.n_layers, c.d_model)
    assert model.W_U.shape == (c.d_model, c.d_vocab)
    assert model.W_E.shape == (c.d_vocab, c.d_model)
    # W_Q reproduces the q projection per head
    x = torch.randn(3, c.d_model)
    q = hf.model.language_model.layers[0].self_attn.q_proj(x).view(3, c.n_heads, c.d_head)
    torch.testing.assert_close(torch.einsum("pm,hmd->phd", x, model.W_Q[0]) + model.b_Q[0], q, atol=1e-5, rtol=0)
    # parameters are shared with HF, not copied
    assert model.blocks[0].attn.q_proj.weight is hf.model.language_model.layers[0].self_attn.q_proj.weight


def test_unknown_hook_name_is_a_clear_error(qwen_pair):
    hf, model = qwen_pair("qwen2_5_vl")
    inputs = _inputs(model)
    with pytest.raises(ValueError, match=r"No hook point named 'blocks.7.attn.hook_z'.*2 layers"):
        model.run_with_hooks(inputs, fwd_hooks=[("blocks.7.attn.hook_z", lambda x, hook: x)])
    with pytest.raises(ValueError, match="Did you mean 'blocks.0.attn.hook_z'"):
        with model.hooks(fwd_hooks=[("blocks.0.attn.hook_zz", lambda x, hook: x)]):
            pass
    assert all(not hp.fwd_hooks for hp in model.hook_dict.values())

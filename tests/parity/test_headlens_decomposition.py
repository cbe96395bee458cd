"""Per-head decomposition: sum_i z_i @ W_O[i] + b_O == hook_attn_out on every supported architecture."""

from __future__ import annotations

import pytest
import torch

from tests.helpers.headlens_models import BUILDERS, tiny_model, two_image_batch
from vlens.core.architectures.registry import supported_architectures
from vlens.lens.decomposition import (
    flat_W_O,
    head_contributions,
    layer_bias_contribution,
    layer_head_contributions,
    reconstruct_attn_out,
    zero_padded_head_output,
)

torch.set_num_threads(1)


def test_every_supported_architecture_has_a_tiny_model_here():
    assert set(supported_architectures()) <= set(BUILDERS), "add a builder for the new architecture"


@pytest.mark.parametrize("architecture", sorted(BUILDERS))
def test_heads_sum_with_b_O_to_attn_out(architecture):
    model = tiny_model(architecture)
    inputs = two_image_batch(model)
    # a block that normalizes its attention output (Gemma 3's ln1_post) needs that norm's scale too
    names = ("hook_z", "hook_attn_out", "ln1_post.hook_scale")
    _, cache = model.run_with_cache(inputs, names_filter=lambda n: n.endswith(names))
    for layer in range(model.cfg.n_layers):
        per_head = layer_head_contributions(model, cache, layer)
        assert per_head.shape == (*inputs.input_ids.shape, model.cfg.heads_at(layer), model.cfg.d_model)
        bias = layer_bias_contribution(model, cache, layer)  # b_O (through the post norm where there is one)
        torch.testing.assert_close(reconstruct_attn_out(per_head, bias), cache[f"blocks.{layer}.hook_attn_out"],
                                   atol=1e-5, rtol=1e-5, msg=f"{architecture} layer {layer}")


def test_zero_padded_form_and_hook_result_agree():
    model = tiny_model("Qwen2_5_VLForConditionalGeneration")
    inputs = two_image_batch(model)
    model.set_use_attn_result(True)
    try:
        _, cache = model.run_with_cache(inputs, names_filter=lambda n: n.endswith(("hook_z", "hook_result")))
    finally:
        model.set_use_attn_result(False)
    layer = 1
    z, W_O = cache[f"blocks.{layer}.attn.hook_z"], model.blocks[layer].attn.W_O
    ours = head_contributions(z, W_O)
    torch.testing.assert_close(ours, cache[f"blocks.{layer}.attn.hook_result"], atol=1e-6, rtol=0)
    for head in range(model.cfg.n_heads):  # the paper's h~_i @ W_O (zero-padded, flat projection)
        padded = zero_padded_head_output(z, head) @ flat_W_O(W_O)
        torch.testing.assert_close(padded, ours[:, :, head], atol=1e-6, rtol=0)


def test_hand_computed_contribution():
    z = torch.tensor([[1.0, 2.0], [3.0, 0.0]])  # 2 heads, d_head 2
    W_O = torch.tensor([[[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]], [[0.0, 0.0, 2.0], [5.0, 5.0, 5.0]]])
    out = head_contributions(z, W_O)
    assert out.tolist() == [[1.0, 2.0, 0.0], [0.0, 0.0, 6.0]]


def test_bad_shapes_are_explained():
    with pytest.raises(ValueError, match="n_heads, d_head"):
        head_contributions(torch.zeros(3, 4, 8), torch.zeros(4, 16, 32))
    with pytest.raises(IndexError):
        zero_padded_head_output(torch.zeros(2, 4, 8), 4)


@pytest.mark.parametrize("architecture", sorted(BUILDERS))
def test_headlens_runs_on_every_architecture(architecture):
    """HeadLens.run (hooks, final positions) == decode_heads on a full cache, per architecture."""
    from vlens.lens.headlens import HeadLens

    model = tiny_model(architecture)
    inputs = two_image_batch(model)
    lens = HeadLens(model)
    out = lens.run(inputs, k=3, return_logits=True)
    names = ("hook_z", "hook_resid_post", "ln1_post.hook_scale")
    _, cache = model.run_with_cache(inputs, names_filter=lambda n: n.endswith(names))
    rows, final = torch.arange(2), inputs.regions.final
    for layer in range(model.cfg.n_layers):
        z = cache[f"blocks.{layer}.attn.hook_z"][rows, final]
        scale = cache.cache_dict.get(f"blocks.{layer}.ln1_post.hook_scale")
        expected = lens.decode_heads(z, cache[f"blocks.{layer}.hook_resid_post"][rows, final], layer,
                                     None if scale is None else scale[rows, final])
        heads = model.cfg.heads_at(layer)  # hybrid decoders: the widest layer sets the width, the rest is empty
        torch.testing.assert_close(out.logits[:, 0, layer, :heads], expected, atol=1e-4, rtol=1e-4)
        assert (out.top_ids[:, 0, layer, :heads] == expected.topk(3, dim=-1).indices).all()
        assert bool((out.top_ids[:, 0, layer, heads:] == -1).all())
        # a linear-attention layer has no attention pattern: no image attention
        assert bool(out.image_attention[:, 0, layer].isnan().all()) == model.cfg.is_linear_attention(layer)
        mass = out.image_attention[:, 0, layer, :heads]
        assert mass.isnan().all() or ((mass >= 0) & (mass <= 1 + 1e-6)).all()

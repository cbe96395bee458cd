"""LLaVA-1.5 in HookedVLM: the parity matrix against HF eager on several tiny shapes, vision
feature selection (layer int/list, default/full), projector and CLIP hooks, prompt format."""

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

# head counts, GQA ratios, biases, vision feature layer (int / list) and select strategy, patch grids
SHAPES = {
    "gqa2_layer-2_default": dict(n_heads=4, n_kv_heads=2),
    "gqa4_layers_list_full_bias": dict(n_heads=8, n_kv_heads=2, vision_feature_layer=[-3, -1],
                                       vision_feature_select_strategy="full", attention_bias=True, mlp_bias=True,
                                       vision_heads=4),
    "mha_layer1_default_3x3": dict(d_model=48, n_heads=3, n_kv_heads=3, head_dim=20, vision_feature_layer=1, image_size=48,
                                   patch_size=16),
}


@functools.lru_cache(maxsize=4)
def _pair(shape: str):
    from vlens import HookedVLM
    from vlens.testing import tiny_llava_model, tiny_llava_processor

    kw = SHAPES[shape]
    hf = tiny_llava_model(seed=len(shape), **kw)
    processor = tiny_llava_processor(image_size=kw.get("image_size", 32), patch_size=kw.get("patch_size", 8),
                                     strategy=kw.get("vision_feature_select_strategy", "default"))
    return hf, HookedVLM.from_hf(hf, processor=processor)


def _cases(model) -> dict:
    return input_matrix(model, [(40, 60), (80, 64), (32, 48), (64, 64), (50, 50), (64, 96)])


@pytest.mark.parametrize("shape", list(SHAPES))
def test_logits_match_hf_eager(shape):
    hf, model = _pair(shape)
    assert model.cfg.rope_kind == "1d" and not model.cfg.qk_norm
    assert model.cfg.d_head == SHAPES[shape].get("head_dim", model.cfg.d_model // model.cfg.n_heads)
    assert_logits_match(model, hf, _cases(model))


def test_hf_keyword_form_and_processor_output_work():
    hf, model = _pair("gqa2_layer-2_default")
    inputs = _cases(model)["left_padded_batch"]
    kwargs = inputs.to_hf_kwargs()
    assert "mm_token_type_ids" not in kwargs and "image_grid_thw" not in kwargs
    with torch.no_grad():
        torch.testing.assert_close(model(**kwargs), model(inputs), atol=0, rtol=0)
        raw = model.processor(text=["USER: <image>\nred ASSISTANT:"], images=[random_image(32, 32, 9)],
                              return_tensors="pt")
        torch.testing.assert_close(model(raw), hf(**raw).logits, atol=1e-4, rtol=0)


def test_placeholder_expansion_and_regions():
    for shape, per_image in [("gqa2_layer-2_default", 16), ("gqa4_layers_list_full_bias", 17),
                             ("mha_layer1_default_3x3", 9)]:
        hf, model = _pair(shape)
        inputs = _cases(model)["two_images_different_sizes"]
        assert [len(p) for p in inputs.regions.images[0]] == [per_image, per_image], shape
        assert int((inputs.input_ids == model.cfg.image_token_id).sum()) == 2 * per_image
    assert inputs.regions.image_grid[0] == [(3, 3), (3, 3)]


def test_prompt_format():
    hf, model = _pair("gqa2_layer-2_default")
    inputs = model.prepare(images=[random_image(32, 32, 1)], prompts=["How many dots are there?"])
    tokens = [t for t in model.to_str_tokens(inputs.input_ids[0]) if t != "<image>"]
    assert tokens == ["USER", ":", "How", "many", "dots", "are", "there", "?", "ASSISTANT", ":"]
    assert model.adapter.fallback_chat_prompt("What colour ?", 1) == "USER: <image>\nWhat colour ? ASSISTANT:"


def test_hook_shapes_including_vision_and_projector():
    hf, model = _pair("gqa4_layers_list_full_bias")
    inputs = _cases(model)["left_padded_batch"]
    cache = assert_hook_shapes(model, inputs)
    n_images, n_tokens = 2, 17  # 4x4 patches + CLS ("full")
    assert tuple(cache["vision.hook_image_features"].shape) == (n_images, n_tokens, 2 * 32)  # two layers concatenated
    assert tuple(cache["vision.hook_image_embeds"].shape) == (n_images * n_tokens, model.cfg.d_model)
    assert tuple(cache["vision.blocks.0.hook_resid_post"].shape) == (n_images, n_tokens, 32)
    assert tuple(cache["vision.blocks.2.attn.hook_z"].shape) == (n_images, n_tokens, 4, 8)


def test_vision_layers_after_the_selected_one_run_but_do_not_matter():
    hf, model = _pair("mha_layer1_default_3x3")  # vision_feature_layer=1: the output of CLIP layer 0
    inputs = _cases(model)["one_image"]
    _, cache = model.run_with_cache(inputs, names_filter=lambda n: n.startswith("vision."))
    assert {f"vision.blocks.{i}.hook_resid_post" for i in range(3)} <= set(cache.cache_dict)
    with torch.no_grad():
        plain = model(inputs)
        late = model.run_with_hooks(inputs, fwd_hooks=[("vision.blocks.1.hook_resid_post", lambda x, hook: x * 0)])
        early = model.run_with_hooks(inputs, fwd_hooks=[("vision.blocks.0.hook_resid_post", lambda x, hook: x * 0)])
    torch.testing.assert_close(late, plain, atol=0, rtol=0)
    assert (early - plain).abs().max() > 1e-4


@pytest.mark.parametrize("shape", ["gqa2_layer-2_default", "gqa4_layers_list_full_bias"])
def test_vision_block_edit_equals_hf_edit(shape):
    """Adding a vector to a CLIP block's output equals adding it to that block's MLP output in HF."""
    hf, model = _pair(shape)
    inputs = _cases(model)["one_image"]
    delta = torch.linspace(-1, 1, 32)
    block = 0
    with torch.no_grad():
        ours = model.run_with_hooks(inputs, fwd_hooks=[(f"vision.blocks.{block}.hook_resid_post",
                                                        lambda x, hook: x + delta)])
        plain = model(inputs)
    fc2 = hf.model.vision_tower.encoder.layers[block].mlp.fc2
    expected = hf_logits(hf, inputs, forward_hooks=[(fc2, lambda mod, args, out: out + delta)])
    torch.testing.assert_close(ours, expected, atol=1e-4, rtol=0)
    assert (ours - plain).abs().max() > 1e-4


def test_vision_head_edit_equals_hf_out_proj_input_edit():
    hf, model = _pair("gqa4_layers_list_full_bias")
    inputs = _cases(model)["one_image"]

    def drop_head(z, hook):
        z = z.clone()
        z[..., 2, :] = 0
        return z

    def drop_head_hf(module, args):
        x = args[0].clone()
        x[..., 16:24] = 0  # head 2 of 4, d_head 8
        return (x,)

    out_proj = hf.model.vision_tower.encoder.layers[1].self_attn.out_proj
    expected = hf_logits(hf, inputs, pre_hooks=[(out_proj, drop_head_hf)])
    with torch.no_grad():
        ours = model.run_with_hooks(inputs, fwd_hooks=[("vision.blocks.1.attn.hook_z", drop_head)])
    torch.testing.assert_close(ours, expected, atol=1e-4, rtol=0)


def test_projector_hooks_edit_like_hf():
    hf, model = _pair("gqa2_layer-2_default")
    inputs = _cases(model)["left_padded_batch"]
    projector = hf.model.multi_modal_projector
    expected_zero = hf_logits(hf, inputs, forward_hooks=[(projector, lambda mod, args, out: out * 0)])
    expected_in = hf_logits(hf, inputs, pre_hooks=[(projector, lambda mod, args: (args[0] * 0.5,))])
    with torch.no_grad():
        ours_zero = model.run_with_hooks(inputs, fwd_hooks=[("vision.hook_image_embeds", lambda x, hook: x * 0)])
        ours_in = model.run_with_hooks(inputs, fwd_hooks=[("vision.hook_image_features", lambda x, hook: x * 0.5)])
    torch.testing.assert_close(ours_zero, expected_zero, atol=1e-4, rtol=0)
    torch.testing.assert_close(ours_in, expected_in, atol=1e-4, rtol=0)


@pytest.mark.parametrize("shape", ["gqa2_layer-2_default", "gqa4_layers_list_full_bias"])
def test_head_decomposition(shape):
    hf, model = _pair(shape)
    assert_head_decomposition(model, _cases(model)["left_padded_batch"])


@pytest.mark.parametrize("shape", ["gqa2_layer-2_default", "gqa4_layers_list_full_bias"])
def test_hook_z_edit_equals_hf_o_proj_input_edit(shape):
    hf, model = _pair(shape)
    assert_hook_z_edit_matches_hf(model, hf, _cases(model)["left_padded_batch"], layer=1, head=1)


@pytest.mark.parametrize("shape", list(SHAPES))
def test_attn_scores_edit_equals_scaling_q(shape):
    hf, model = _pair(shape)
    assert_scores_edit_matches_scaling_q(model, hf, _cases(model)["left_padded_batch"], layer=0, head=1)


@pytest.mark.parametrize("case", ["left_padded_batch", "two_images_different_sizes", "text_only",
                                  "mixed_batch_with_text_only_row"])
def test_greedy_generate_matches_hf(case):
    hf, model = _pair("gqa2_layer-2_default")
    assert_generate_matches_hf(model, hf, _cases(model)[case])


def test_decode_positions_continue_the_prompt():
    hf, model = _pair("gqa2_layer-2_default")
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    assert model.adapter.position_ids(hf, _cases(model)["text_only"])[1] is None
    assert model.adapter.decode_position_ids(mask, 1).tolist() == [[2], [4]]


def test_no_hooks_left_after_exception():
    hf, model = _pair("gqa2_layer-2_default")
    assert_no_hooks_left_after_exception(model, _cases(model)["one_image"],
                                         ["vision.hook_image_features", "blocks.1.attn.hook_attn_scores",
                                          "vision.blocks.0.attn.hook_z"])


def test_unknown_select_strategy_is_a_clear_error():
    hf, model = _pair("gqa2_layer-2_default")
    inputs = _cases(model)["one_image"]
    with pytest.raises(ValueError, match="vision_feature_select_strategy"):
        model(**inputs.to_hf_kwargs(), vision_feature_select_strategy="cls")


def test_saved_checkpoint_loads_with_its_processor(tmp_path):
    hf, model = _pair("gqa2_layer-2_default")
    assert_saved_checkpoint_loads(hf, model.processor, tmp_path, [random_image(40, 40, 1), random_image(64, 32, 2)])

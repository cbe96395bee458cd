"""Idefics3 and SmolVLM in HookedVLM: the parity matrix against HF eager on tiny shapes unlike the released
ones (sub-image sides, patch sizes, scale factors), sub-image regions read back from HF's own forward,
the row / column tags and separators, the layout against the pixels, and edits on every vision hook."""

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
    input_matrix,
)
from tests.helpers.split_image_parity import (
    assert_layout_follows_pixels,
    assert_regions_follow_hf_features,
    assert_split_image_edits_match_hf,
)
from vlens.testing import random_image
from vlens.utils.errors import UserInputError

SHAPES = {
    # Idefics3: 24 px sub-images of 4 px patches, scale factor 3 -> 2x2 tokens, images resized to 60 px
    "idefics3_s24_p4_x3": dict(family="idefics3", model=dict(d_model=40, n_heads=5, n_kv_heads=1, sub_image=24,
                                                              patch_size=4, scale_factor=3),
                               processor=dict(sub_image=24, patch_size=4, scale_factor=3, longest_edge=60)),
    # Idefics3, head_dim unlike d_model / n_heads, 32 px of 8 px patches, scale 2 -> 2x2 tokens, 4 heads in the tower
    "idefics3_head12": dict(family="idefics3", model=dict(d_model=48, n_heads=4, n_kv_heads=2, head_dim=12,
                                                           sub_image=32, patch_size=8, vision_width=32,
                                                           vision_heads=4),
                            processor=dict(sub_image=32, patch_size=8, longest_edge=96)),
    # SmolVLM: 36 px of 6 px patches, scale 2 -> 3x3 tokens, images resized to 72 px
    "smolvlm_s36_p6": dict(family="smolvlm", model=dict(d_model=36, n_heads=6, n_kv_heads=3, sub_image=36,
                                                         patch_size=6),
                           processor=dict(sub_image=36, patch_size=6, longest_edge=72)),
}
SIZES = [(40, 70), (90, 30), (33, 47), (64, 64), (50, 20), (28, 96)]  # (width, height): aspect ratios differ


@functools.lru_cache(maxsize=4)
def _pair(shape: str):
    from vlens import HookedVLM
    from vlens.testing import (
        tiny_idefics3_model,
        tiny_idefics3_processor,
        tiny_smolvlm_model,
        tiny_smolvlm_processor,
    )

    spec = SHAPES[shape]
    smolvlm = spec["family"] == "smolvlm"
    hf = (tiny_smolvlm_model if smolvlm else tiny_idefics3_model)(seed=len(shape), **spec["model"])
    processor = (tiny_smolvlm_processor if smolvlm else tiny_idefics3_processor)(**spec["processor"])
    return hf, HookedVLM.from_hf(hf, processor=processor)


def _unsplit(shape: str):
    """The same HF model with a processor that does not split images (each image: one sub-image)."""
    from vlens import HookedVLM
    from vlens.testing import tiny_idefics3_processor, tiny_smolvlm_processor

    spec = SHAPES[shape]
    build = tiny_smolvlm_processor if spec["family"] == "smolvlm" else tiny_idefics3_processor
    return HookedVLM.from_hf(_pair(shape)[0], processor=build(**{**spec["processor"], "split": False}))


@functools.lru_cache(maxsize=4)
def _cases(shape: str) -> dict:
    return input_matrix(_pair(shape)[1], SIZES)


@pytest.mark.parametrize("shape", list(SHAPES))
def test_logits_match_hf_eager(shape):
    hf, model = _pair(shape)
    assert model.adapter.family == SHAPES[shape]["family"]
    assert_logits_match(model, hf, _cases(shape))


@pytest.mark.parametrize("shape", list(SHAPES))
def test_regions_follow_hf_features(shape):
    hf, model = _pair(shape)
    for case in ("one_image", "two_images_different_sizes", "left_padded_batch", "mixed_batch_with_text_only_row"):
        assert_regions_follow_hf_features(model, hf, _cases(shape)[case], hf.model.connector)


@pytest.mark.parametrize("shape", ["idefics3_s24_p4_x3", "smolvlm_s36_p6"])
def test_markers_are_the_tags_and_separators(shape):
    """Every marker names the token it sits on: <row_r_col_c> with its layout cell, <global-img>, the
    <fake_token_around_image> boundaries, the newlines after each tile row; none is an image token."""
    hf, model = _pair(shape)
    inputs = _cases(shape)["two_images_different_sizes"]
    tokens = model.to_str_tokens(inputs.input_ids[0])
    names = {"global_tag": "<global-img>", "boundary": "<fake_token_around_image>", "newline": "\n"}
    for records, marks in zip(inputs.regions.tiles[0], inputs.regions.markers[0], strict=True):
        tiles = [r for r in records if r.kind == "tile"]
        tags = [m for m in marks if m.kind == "tile_tag"]
        assert [t.layout for t in tags] == [t.layout for t in tiles]
        for mark in marks:
            token = tokens[int(mark.positions[0])]
            if mark.kind == "tile_tag":
                assert token == f"<row_{mark.layout[0] + 1}_col_{mark.layout[1] + 1}>"
            else:
                assert token == names[mark.kind], (mark, token)
        rows = tiles[-1].layout_grid[0] if tiles else 0
        assert sum(m.kind == "newline" for m in marks) == (rows + 1 if rows else 0)  # "\n" per row + "\n" before global
        assert sum(m.kind == "global_tag" for m in marks) == 1
        assert sum(m.kind == "boundary" for m in marks) == len(records) + 1
    assert not set(inputs.regions.marker_positions(0, "boundary").tolist()) & set(inputs.regions.image[0].tolist())


def test_regions_of_a_hand_computed_image():
    """A 90 x 30 image resized to 60 px wide (20 high), sub-images of 24 px: resize_for_vision_encoder makes it
    72 x 24, so 1 x 3 sub-images of 30 x 30 original px, then the global image; 2 x 2 tokens each."""
    hf, model = _pair("idefics3_s24_p4_x3")
    inputs = model.prepare(images=[random_image(90, 30, 1)], prompts=["red"])
    records = inputs.regions.tiles[0][0]
    assert [(r.kind, r.grid, r.layout, r.layout_grid, r.index) for r in records] == [
        ("tile", (2, 2), (0, 0), (1, 3), 0), ("tile", (2, 2), (0, 1), (1, 3), 1), ("tile", (2, 2), (0, 2), (1, 3), 2),
        ("base", (2, 2), None, None, 3)]
    from vlens.core.architectures.base import layout_box

    assert [layout_box((90, 30), r.layout, r.layout_grid) for r in records[:3]] == [
        (0.0, 0.0, 30.0, 30.0), (30.0, 0.0, 60.0, 30.0), (60.0, 0.0, 90.0, 30.0)]
    first = int(inputs.regions.images[0][0][0])
    # <fake><row_1_col_1> LLLL <fake><row_1_col_2> LLLL <fake><row_1_col_3> LLLL \n \n <fake><global-img> LLLL <fake>
    assert [int(r.positions[0]) - first for r in records] == [0, 6, 12, 20]
    assert inputs.regions.image_view(0).kind == "base" and inputs.regions.image_grid[0] == [(2, 2)]
    # without splitting an image is one sub-image: one "image" record, only the global part
    unsplit = _unsplit("idefics3_s24_p4_x3").prepare(images=[random_image(20, 50, 2)], prompts=["red"])
    assert [(r.kind, r.grid) for r in unsplit.regions.tiles[0][0]] == [("image", (2, 2))]
    assert [m.kind for m in unsplit.regions.markers[0][0]] == ["boundary", "global_tag", "boundary"]
    assert_logits_match(_unsplit("idefics3_s24_p4_x3"), hf, {"unsplit": unsplit})


def test_sub_image_layout_follows_the_pixels():
    hf, model = _pair("idefics3_s24_p4_x3")

    def frames(inputs):
        return inputs.pixel_values[0]

    for width, height in [(90, 30), (30, 80), (70, 50)]:
        assert_layout_follows_pixels(model, width, height, frames)


def test_without_a_processor_the_regions_still_split_the_images():
    """No tokenizer, so the tags are unknown: the logits are HF's, every image still ends at its global image
    (the tag every prompt's last image ends with) and each sub-image is a record, not placed on the image."""
    from vlens import HookedVLM

    hf, model = _pair("idefics3_s24_p4_x3")
    bare = HookedVLM.from_hf(hf)
    kwargs = _cases("idefics3_s24_p4_x3")["two_images_different_sizes"].to_hf_kwargs()
    with torch.no_grad():
        torch.testing.assert_close(bare(**kwargs), hf(**kwargs).logits, atol=1e-4, rtol=0)
    regions = bare.coerce_inputs(kwargs).regions
    expected = _cases("idefics3_s24_p4_x3")["two_images_different_sizes"].regions
    assert [len(p) for p in regions.images[0]] == [len(p) for p in expected.images[0]]
    assert [[(r.kind, r.spatial) for r in rs] for rs in regions.tiles[0]] == \
        [[(r.kind, r.kind != "tile") for r in rs] for rs in expected.tiles[0]]
    assert regions.markers == []


@pytest.mark.parametrize("shape", ["idefics3_s24_p4_x3", "smolvlm_s36_p6"])
def test_vision_hook_edits_equal_hf_edits(shape):
    hf, model = _pair(shape)
    tower = hf.model.vision_model
    assert_split_image_edits_match_hf(model, hf, _cases(shape)["two_images_different_sizes"], tower.encoder.layers,
                                      lambda layer: layer.self_attn.out_proj, hf.model.connector.modality_projection,
                                      block=1)


@pytest.mark.parametrize("shape", list(SHAPES))
def test_decoder_hooks_and_edits(shape):
    hf, model = _pair(shape)
    inputs = _cases(shape)["left_padded_batch"]
    cache = assert_hook_shapes(model, inputs)
    vision = hf.config.vision_config
    n_frames = int(model.adapter.real_frames(inputs).sum())
    side = inputs.pixel_values.shape[-1] // vision.patch_size
    width, heads = vision.hidden_size, vision.num_attention_heads
    for block in range(vision.num_hidden_layers):
        assert cache[f"vision.blocks.{block}.hook_resid_post"].shape == (n_frames, side**2, width)
        assert cache[f"vision.blocks.{block}.attn.hook_z"].shape == (n_frames, side**2, heads, width // heads)
    tokens = (side // hf.config.scale_factor) ** 2
    assert cache["vision.hook_tile_embeds"].shape == (n_frames, tokens, model.cfg.d_model)
    assert cache["vision.hook_image_features"].shape == (n_frames, tokens, width * hf.config.scale_factor**2)
    assert_head_decomposition(model, inputs)
    assert_hook_z_edit_matches_hf(model, hf, inputs, layer=1, head=1)
    assert_scores_edit_matches_scaling_q(model, hf, inputs, layer=0, head=2)


@pytest.mark.parametrize("shape,case", [("idefics3_s24_p4_x3", "left_padded_batch"),
                                        ("idefics3_s24_p4_x3", "two_images_different_sizes"),
                                        ("idefics3_s24_p4_x3", "text_only"),
                                        ("smolvlm_s36_p6", "mixed_batch_with_text_only_row"),
                                        ("smolvlm_s36_p6", "left_padded_batch")])
def test_greedy_generate_matches_hf(shape, case):
    hf, model = _pair(shape)
    assert_generate_matches_hf(model, hf, _cases(shape)[case])


def test_prompt_format_and_no_hooks_left():
    hf, model = _pair("smolvlm_s36_p6")
    inputs = _unsplit("smolvlm_s36_p6").prepare(images=[random_image(30, 30, 1)], prompts=["How many dots are there?"])
    tokens = [t for t in model.to_str_tokens(inputs.input_ids[0]) if t != "<image>"]
    assert tokens == ["<|im_start|>", "User", ":", "<fake_token_around_image>", "<global-img>",
                      "<fake_token_around_image>", "How", "many", "dots", "are", "there", "?", "<end_of_utterance>",
                      "\n", "Assistant", ":"]
    assert model.adapter.fallback_chat_prompt("red ?", 1) == "<|im_start|>User:<image>red ?<end_of_utterance>\nAssistant:"
    assert_no_hooks_left_after_exception(model, _cases("smolvlm_s36_p6")["one_image"],
                                         ["vision.hook_tile_embeds", "vision.hook_image_features",
                                          "blocks.1.attn.hook_attn_scores", "vision.blocks.0.attn.hook_z"])


def test_bad_inputs_are_clear_errors():
    hf, model = _pair("idefics3_s24_p4_x3")
    kwargs = _cases("idefics3_s24_p4_x3")["two_images_different_sizes"].to_hf_kwargs()
    with pytest.raises(UserInputError, match="one row per prompt"):
        model(**{**kwargs, "pixel_values": kwargs["pixel_values"][0]})
    with pytest.raises(UserInputError, match="sub-images"):
        model(**{**kwargs, "pixel_values": kwargs["pixel_values"][:, :-1]})
    with pytest.raises(UserInputError, match="square"):
        model(**{**kwargs, "pixel_values": kwargs["pixel_values"][..., :12]})


@pytest.mark.parametrize("shape", ["idefics3_head12", "smolvlm_s36_p6"])
def test_saved_checkpoint_loads_with_its_processor(shape, tmp_path):
    hf, model = _pair(shape)
    assert_saved_checkpoint_loads(hf, model.processor, tmp_path, [random_image(70, 40, 1), random_image(30, 64, 2)])


def test_image_size_sets_the_longest_edge():
    """--image-size N resizes every image to N px on its longest edge before splitting it."""
    from vlens.core.devices import configure_resolution
    from vlens.testing import tiny_idefics3_processor

    processor = configure_resolution(tiny_idefics3_processor(sub_image=24, patch_size=4, scale_factor=3), image_size=96)
    out = processor(text=["<image>"], images=[[random_image(200, 100, 1)]], return_tensors="pt")
    assert out["pixel_values"].shape[1] == 4 * 2 + 1  # 96 x 48 -> 4 x 2 sub-images and the global image


def test_focus_prior_lands_on_the_sub_image_that_holds_the_object():
    """An object in the right third of a 90 x 30 image (1 x 3 sub-images, placed by their tags) puts its
    sub-image mass on (0, 2) and almost none on (0, 0); the global image gets its share."""
    from vlens.interventions.focus import focus_prior

    hf, model = _pair("idefics3_s24_p4_x3")
    inputs = model.prepare(images=[random_image(90, 30, 1)], prompts=["red"])
    weights = focus_prior(inputs, [[([(80.0, 15.0)], (90, 30))]], model=model).weights[0]
    mass = {r.layout or r.kind: float(weights[r.positions].sum()) for r in inputs.regions.tiles[0][0]}
    assert mass[(0, 2)] > 5 * mass[(0, 1)] and mass[(0, 0)] < 1e-3 and mass["base"] > 0.2

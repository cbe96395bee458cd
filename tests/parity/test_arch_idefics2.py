"""Idefics2 in HookedVLM: the parity matrix against HF eager on tiny shapes unlike the released ones (frame
sizes, patch sizes, perceiver latents / depth / heads), split and unsplit images, regions read back from HF's
own forward, the boundary markers, bf16 within HF's own bf16 noise, and edits on every vision and resampler
hook made on both sides."""

from __future__ import annotations

import functools

import pytest
import torch

from tests.helpers.arch_parity import (
    assert_bf16_within_hf_noise,
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
from tests.helpers.split_image_parity import (
    assert_regions_follow_hf_features,
    assert_split_image_edits_match_hf,
)
from vlens.testing import random_image
from vlens.utils.errors import UserInputError

SHAPES = {
    # frames of 20-36 px (padded, partial patches dropped) of 6 px patches, 7 latents from 3 perceiver layers
    "split_p6_l7": dict(model=dict(d_model=40, n_heads=5, n_kv_heads=1, patch_size=6, image_size=36, n_latents=7,
                                   resampler_depth=3, resampler_heads=2, resampler_head_dim=12),
                        processor=dict(shortest_edge=20, longest_edge=36, n_latents=7, split=True)),
    # unsplit, head_dim unlike d_model / n_heads, GQA 4:2, 4 vision heads, 3 latents of 1 layer with 4 heads
    "whole_head12_l3": dict(model=dict(d_model=48, n_heads=4, n_kv_heads=2, head_dim=12, patch_size=4, image_size=28,
                                       vision_width=32, vision_heads=4, n_latents=3, resampler_depth=1,
                                       resampler_heads=4, resampler_head_dim=6, resampler_kv_heads=2),
                            processor=dict(shortest_edge=16, longest_edge=28, n_latents=3)),
}
SIZES = [(40, 70), (90, 30), (33, 47), (64, 64), (50, 20), (28, 96)]  # (width, height): aspect ratios differ


@functools.lru_cache(maxsize=2)
def _pair(shape: str):
    from vlens import HookedVLM
    from vlens.testing import tiny_idefics2_model, tiny_idefics2_processor

    spec = SHAPES[shape]
    hf = tiny_idefics2_model(seed=len(shape), **spec["model"])
    return hf, HookedVLM.from_hf(hf, processor=tiny_idefics2_processor(**spec["processor"]))


@functools.lru_cache(maxsize=2)
def _cases(shape: str) -> dict:
    return input_matrix(_pair(shape)[1], SIZES)


@pytest.mark.parametrize("shape", list(SHAPES))
def test_logits_match_hf_eager(shape):
    hf, model = _pair(shape)
    assert model.adapter.family == "idefics2"
    assert_logits_match(model, hf, _cases(shape))


@pytest.mark.parametrize("shape", list(SHAPES))
def test_regions_follow_hf_features(shape):
    hf, model = _pair(shape)
    for case in ("one_image", "two_images_different_sizes", "left_padded_batch", "mixed_batch_with_text_only_row"):
        assert_regions_follow_hf_features(model, hf, _cases(shape)[case], hf.model.connector)


def test_regions_and_markers_of_split_images():
    """A split image is 4 crops (2 x 2 layout, HF's order) and the whole image, 7 latents each, none placed on
    the image; the boundaries between frames are shared, and two adjacent images share one."""
    hf, model = _pair("split_p6_l7")
    inputs = _cases("split_p6_l7")["two_images_different_sizes"]
    tokens = model.to_str_tokens(inputs.input_ids[0])
    for records in inputs.regions.tiles[0]:
        assert [(r.kind, r.index, r.layout, r.grid, r.spatial) for r in records] == [
            ("tile", 0, (0, 0), (1, 7), False), ("tile", 1, (0, 1), (1, 7), False),
            ("tile", 2, (1, 0), (1, 7), False), ("tile", 3, (1, 1), (1, 7), False), ("base", 4, None, (1, 7), False)]
    first, second = (torch.cat([m.positions for m in marks]).tolist() for marks in inputs.regions.markers[0])
    assert all(tokens[p] == "<fake_token_around_image>" for p in first + second)
    assert len(first) == len(second) == 6 and first[-1] == second[0]
    assert inputs.regions.image_view(0, 0).kind == "base" and inputs.regions.image_grid[0] == [(1, 7), (1, 7)]
    # a non-spatial image gets no focus mass: the prior has nothing to put on its latents
    from vlens.interventions.focus import focus_prior

    one = _cases("split_p6_l7")["one_image"]
    assert not bool(focus_prior(one, [[([(10.0, 10.0)], (40, 70))]], model=model).valid[0])
    # nor can a pixel box select any of them: one clear error
    with pytest.raises(UserInputError, match="no token that is a place on the image"):
        one.regions.from_box(0, (0, 0, 20, 20))


def test_split_crops_follow_hf_split_order():
    """The crops' pixels are HF's split_images of the image, in the records' `index` order: a ramp's mean red
    (x) and green (y) of crop (r, c) sit in the band its layout cell names."""
    from tests.helpers.split_image_parity import ramp_image

    hf, model = _pair("split_p6_l7")
    inputs = model.prepare(images=[ramp_image(60, 40)], prompts=["red"])
    processor = model.processor.image_processor
    mean = torch.tensor(processor.image_mean)[:, None, None]
    std = torch.tensor(processor.image_std)[:, None, None]
    mask = inputs.extra["pixel_attention_mask"][0].bool()
    for record in inputs.regions.tiles[0][0][:4]:
        frame = inputs.pixel_values[0, record.index] * std + mean
        red, green = (float(frame[c][mask[record.index]].mean()) for c in (0, 1))
        r, c = record.layout
        assert c * 0.5 < red < (c + 1) * 0.5 and r * 0.5 < green < (r + 1) * 0.5, (record, red, green)


@pytest.mark.parametrize("shape", list(SHAPES))
def test_vision_and_connector_edits_equal_hf_edits(shape):
    hf, model = _pair(shape)
    tower = hf.model.vision_model
    inputs = _cases(shape)["two_images_different_sizes"]
    assert_split_image_edits_match_hf(model, hf, inputs, tower.encoder.layers, lambda layer: layer.self_attn.out_proj,
                                      hf.model.connector, block=1)


@pytest.mark.parametrize("shape", list(SHAPES))
def test_resampler_hooks_equal_hf_edits(shape):
    """Editing the context the latents read (`vision.hook_resampler_context`) or a perceiver layer's output
    (`vision.resampler.{j}.hook_latents`) equals the same edit on HF's modality projection / perceiver layer."""
    hf, model = _pair(shape)
    inputs = _cases(shape)["left_padded_batch"]
    connector = hf.model.connector
    delta = torch.linspace(-1, 1, model.cfg.d_model)
    with torch.no_grad():
        plain = model(inputs)
        got = model.run_with_hooks(inputs, fwd_hooks=[("vision.hook_resampler_context", lambda x, hook: x * 0.5)])
    expected = hf_logits(hf, inputs, forward_hooks=[(connector.modality_projection, lambda m, a, out: out * 0.5)])
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=0)
    assert (got - plain).abs().max() > 1e-4
    last = len(connector.perceiver_resampler.layers) - 1
    with torch.no_grad():
        got = model.run_with_hooks(inputs, fwd_hooks=[(f"vision.resampler.{last}.hook_latents",
                                                       lambda x, hook: x + delta)])
    layer = connector.perceiver_resampler.layers[last]
    expected = hf_logits(hf, inputs, forward_hooks=[(layer, lambda m, a, out: out + delta)])
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=0)
    assert (got - plain).abs().max() > 1e-4


@pytest.mark.parametrize("shape", list(SHAPES))
def test_decoder_hooks_and_edits(shape):
    hf, model = _pair(shape)
    inputs = _cases(shape)["left_padded_batch"]
    cache = assert_hook_shapes(model, inputs)
    n_frames = int(model.adapter.real_frames(inputs).sum())
    vision, perceiver = hf.config.vision_config, hf.config.perceiver_config
    side = inputs.pixel_values.shape[-2] // vision.patch_size, inputs.pixel_values.shape[-1] // vision.patch_size
    width, heads = vision.hidden_size, vision.num_attention_heads
    for block in range(vision.num_hidden_layers):
        assert cache[f"vision.blocks.{block}.hook_resid_post"].shape == (n_frames, side[0] * side[1], width)
        assert cache[f"vision.blocks.{block}.attn.hook_z"].shape == (n_frames, side[0] * side[1], heads, width // heads)
    assert cache["vision.hook_image_features"].shape == (n_frames, side[0] * side[1], width)
    assert cache["vision.hook_resampler_context"].shape == (n_frames, side[0] * side[1], model.cfg.d_model)
    for layer in range(perceiver.resampler_depth):
        assert cache[f"vision.resampler.{layer}.hook_latents"].shape == (n_frames, perceiver.resampler_n_latents,
                                                                          model.cfg.d_model)
    assert cache["vision.hook_tile_embeds"].shape == (n_frames, perceiver.resampler_n_latents, model.cfg.d_model)
    assert_head_decomposition(model, inputs)
    assert_hook_z_edit_matches_hf(model, hf, inputs, layer=1, head=1)
    assert_scores_edit_matches_scaling_q(model, hf, inputs, layer=0, head=2)


@pytest.mark.parametrize("shape,case", [("split_p6_l7", "left_padded_batch"),
                                        ("split_p6_l7", "two_images_different_sizes"),
                                        ("whole_head12_l3", "text_only"),
                                        ("whole_head12_l3", "mixed_batch_with_text_only_row")])
def test_greedy_generate_matches_hf(shape, case):
    hf, model = _pair(shape)
    assert_generate_matches_hf(model, hf, _cases(shape)[case])


def test_bf16_within_hf_bf16_noise():
    hf, model = _pair("split_p6_l7")
    assert_bf16_within_hf_noise(hf, model.processor, lambda m: m.prepare(
        images=[random_image(50, 30, 1), random_image(30, 44, 2)], prompts=["How many dots are there?", "red"]))


def test_prompt_format_and_no_hooks_left():
    hf, model = _pair("whole_head12_l3")
    inputs = model.prepare(images=[random_image(30, 30, 1)], prompts=["How many dots are there?"])
    tokens = [t for t in model.to_str_tokens(inputs.input_ids[0]) if t != "<image>"]
    assert tokens == ["<s>", "User", ":", "<fake_token_around_image>", "<fake_token_around_image>", "How", "many",
                      "dots", "are", "there", "?", "<end_of_utterance>", "\n", "Assistant", ":"]
    assert model.adapter.fallback_chat_prompt("red ?", 1) == "<s>User:<image>red ?<end_of_utterance>\nAssistant:"
    assert_no_hooks_left_after_exception(model, _cases("whole_head12_l3")["one_image"],
                                         ["vision.hook_tile_embeds", "vision.resampler.0.hook_latents",
                                          "blocks.1.attn.hook_attn_scores", "vision.blocks.0.attn.hook_z"])


def test_bad_inputs_are_clear_errors():
    hf, model = _pair("split_p6_l7")
    kwargs = _cases("split_p6_l7")["two_images_different_sizes"].to_hf_kwargs()
    with pytest.raises(UserInputError, match="one row per prompt"):
        model(**{**kwargs, "pixel_values": kwargs["pixel_values"][0]})
    with pytest.raises(UserInputError, match="frames"):
        model(**{**kwargs, "pixel_values": kwargs["pixel_values"][:, :-1]})
    # inputs made for a perceiver of 7 latents, given to a model whose perceiver makes 3
    other = _pair("whole_head12_l3")[1]
    with pytest.raises(UserInputError, match="resampler_n_latents"):
        other(**kwargs)


@pytest.mark.parametrize("shape", list(SHAPES))
def test_saved_checkpoint_loads_with_its_processor(shape, tmp_path):
    hf, model = _pair(shape)
    assert_saved_checkpoint_loads(hf, model.processor, tmp_path, [random_image(70, 40, 1), random_image(30, 64, 2)])

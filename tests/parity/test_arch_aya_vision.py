"""Aya Vision in HookedVLM: the parity matrix against HF eager on tiny shapes, plus what is its own: Cohere2's
parallel attention + MLP from one bias-free LayerNorm, interleaved sliding-window layers with global layers
without any position encoding, the logit scale; SigLIP + pixel shuffle + SwiGLU projector; GotOcr2 tiles with a
thumbnail and their tag tokens as regions and markers."""

from __future__ import annotations

import dataclasses
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
    input_matrix,
)
from tests.helpers.split_image_parity import (
    assert_layout_follows_pixels,
    assert_regions_follow_hf_features,
    assert_split_image_edits_match_hf,
)
from vlens.testing import random_image
from vlens.utils.errors import UserInputError

torch.set_num_threads(1)

SHAPES = {
    # MQA 5:1, sliding layer 0 (window 6) + global layer 1, 24 px tiles of 3 px patches shuffled 2x2 -> 4x4 tokens
    "mqa_window6": dict(model=dict(), processor=dict(tile=24, patch_size=3, downsample=2, max_patches=4)),
    # GQA 2:1 with attention biases, two sliding layers (window 4) then a global one, the second-to-last SigLIP
    # layer, 30 px tiles of 5 px patches shuffled 3x3 -> 2x2 tokens, logit scale above 1
    "gqa_window4_shuffle3": dict(
        model=dict(n_layers=3, d_model=48, n_heads=4, n_kv_heads=2, d_mlp=40, sliding_window=4,
                   sliding_window_pattern=3, logit_scale=1.3, attention_bias=True, tile=30, patch_size=5,
                   downsample=3, vision_width=18, vision_heads=3, vision_depth=3, vision_feature_layer=-2,
                   alignment=36),
        processor=dict(tile=30, patch_size=5, downsample=3, max_patches=3)),
}
SIZES = [(60, 30), (24, 24), (50, 70), (30, 30), (80, 20), (40, 44)]  # (width, height): aspect ratios differ


@functools.lru_cache(maxsize=2)
def _pair(shape: str):
    from vlens import HookedVLM
    from vlens.testing import tiny_aya_vision_model, tiny_aya_vision_processor

    hf = tiny_aya_vision_model(seed=len(shape), **SHAPES[shape]["model"])
    return hf, HookedVLM.from_hf(hf, processor=tiny_aya_vision_processor(**SHAPES[shape]["processor"]))


@functools.lru_cache(maxsize=2)
def _cases(shape: str) -> dict:
    return input_matrix(_pair(shape)[1], SIZES)


@pytest.mark.parametrize("shape", list(SHAPES))
def test_logits_match_hf_eager(shape):
    hf, model = _pair(shape)
    text = hf.config.text_config
    assert model.adapter.family == "aya_vision" and model.cfg.parallel_attn_mlp
    assert model.cfg.nope_layers == [i for i, t in enumerate(text.layer_types) if t == "full_attention"]
    assert model.cfg.sliding_window == text.sliding_window and model.unembed.logit_scale == text.logit_scale
    assert_logits_match(model, hf, _cases(shape))


@pytest.mark.parametrize("shape", list(SHAPES))
def test_regions_follow_hf_features(shape):
    """Every tile / thumbnail record holds the tokens HF's forward fills from that tile, in order."""
    hf, model = _pair(shape)
    for case in ("one_image", "two_images_different_sizes", "left_padded_batch", "mixed_batch_with_text_only_row"):
        assert_regions_follow_hf_features(model, hf, _cases(shape)[case], hf.model.multi_modal_projector)


def test_tile_layout_follows_the_pixels():
    _, model = _pair("mqa_window6")
    pixels = lambda inputs: inputs.pixel_values  # noqa: E731  one image: its tiles are pixel_values in order
    assert_layout_follows_pixels(model, 90, 40, pixels)
    assert_layout_follows_pixels(model, 30, 75, pixels)


def test_markers_are_the_tag_tokens():
    """``<|START_OF_IMG|>``, ``TILE _ k`` before tile k, ``TILE _ GLOBAL`` before the thumbnail, ``<|END_OF_IMG|>``;
    a one-tile image has only its global tag."""
    _, model = _pair("mqa_window6")
    inputs = _cases("mqa_window6")["two_images_different_sizes"]
    tokens = model.tokenizer.convert_ids_to_tokens(inputs.input_ids[0])
    small, tiled = inputs.regions.markers[0]
    assert [m.kind for m in small] == ["start", "global_tag", "end"]
    assert [[tokens[int(p)] for p in m.positions] for m in small] == [
        ["<|START_OF_IMG|>"], ["TILE", "_", "GLOBAL"], ["<|END_OF_IMG|>"]]
    records = inputs.regions.tiles[0][1]
    assert [r.kind for r in records] == ["tile", "tile", "base"] and records[0].layout_grid == (2, 1)
    assert [m.kind for m in tiled] == ["start", "tile_tag", "tile_tag", "global_tag", "end"]
    assert [[tokens[int(p)] for p in m.positions] for m in tiled[1:4]] == [
        ["TILE", "_", "1"], ["TILE", "_", "2"], ["TILE", "_", "GLOBAL"]]
    for mark, record in zip(tiled[1:4], records, strict=True):  # each tag sits right before its tile's tokens
        assert int(mark.positions[-1]) + 1 == int(record.positions[0])


def test_regions_without_a_processor_group_tiles_by_the_global_tag():
    """A model without its tokenizer still groups each image's tiles (the tag before every image's last tile)."""
    from vlens import HookedVLM

    hf, model = _pair("mqa_window6")
    inputs = _cases("mqa_window6")["left_padded_batch"]
    bare = HookedVLM.from_hf(hf)
    assert bare.adapter.tiles_per_image(bare.cfg, inputs) == model.adapter.tiles_per_image(model.cfg, inputs)
    assert bare.adapter.image_markers(bare.cfg, inputs) is None


@pytest.mark.parametrize("case", ["left_padded_batch", "two_images_different_sizes", "mixed_batch_with_text_only_row"])
def test_greedy_generate_matches_hf(case):
    """Past the sliding window (the sliding layers' KV cache keeps only it) and through the global NoPE layer."""
    hf, model = _pair("gqa_window4_shuffle3")
    inputs = _cases("gqa_window4_shuffle3")[case]
    assert inputs.seq_len > model.cfg.sliding_window
    assert_generate_matches_hf(model, hf, inputs, max_new_tokens=6)


def test_hooks_have_transformerlens_shapes_and_parallel_block_adds_up():
    """TransformerLens shapes; resid_post = resid_pre + attn_out + mlp_out and the MLP reads ln1's output."""
    _, model = _pair("mqa_window6")
    inputs = _cases("mqa_window6")["left_padded_batch"]
    cache = assert_hook_shapes(model, inputs)
    n_tiles = inputs.pixel_values.shape[0]
    assert tuple(cache["vision.blocks.1.hook_resid_post"].shape) == (n_tiles, 64, 20)
    assert tuple(cache["vision.blocks.1.attn.hook_z"].shape) == (n_tiles, 64, 2, 10)
    assert tuple(cache["vision.hook_image_features"].shape) == (n_tiles, 64, 20)
    assert tuple(cache["vision.hook_tile_embeds"].shape) == (n_tiles, 16, 40)
    assert_head_decomposition(model, inputs)
    for layer in range(model.cfg.n_layers):
        pre, mid = cache[f"blocks.{layer}.hook_resid_pre"], cache[f"blocks.{layer}.hook_resid_mid"]
        torch.testing.assert_close(mid, pre + cache[f"blocks.{layer}.hook_attn_out"], atol=1e-6, rtol=0)
        torch.testing.assert_close(cache[f"blocks.{layer}.hook_resid_post"], mid + cache[f"blocks.{layer}.hook_mlp_out"],
                                   atol=1e-6, rtol=0)
        block = model.blocks[layer]
        torch.testing.assert_close(block.mlp(block.ln1(pre)), cache[f"blocks.{layer}.hook_mlp_out"], atol=1e-6,
                                   rtol=0)
    with pytest.raises(UserInputError, match="in parallel from one norm"):
        model.blocks[0].ln2(cache["blocks.0.hook_resid_mid"])


@pytest.mark.parametrize("shape", list(SHAPES))
def test_head_edits_equal_hf(shape):
    """On a sliding (RoPE) layer and on the global layer without position encoding."""
    hf, model = _pair(shape)
    inputs = _cases(shape)["left_padded_batch"]
    last = model.cfg.n_layers - 1
    assert last in model.cfg.nope_layers and 0 not in model.cfg.nope_layers
    for layer in (0, last):
        assert_hook_z_edit_matches_hf(model, hf, inputs, layer=layer, head=1)
        assert_scores_edit_matches_scaling_q(model, hf, inputs, layer=layer, head=2, beta=4.0)


def test_global_layers_read_no_positions():
    """A NoPE layer's rotated q / k are its q / k; a sliding layer's differ (RoPE)."""
    _, model = _pair("mqa_window6")
    _, cache = model.run_with_cache(_cases("mqa_window6")["one_image"])
    torch.testing.assert_close(cache["blocks.1.attn.hook_rot_q"], cache["blocks.1.attn.hook_q"], atol=0, rtol=0)
    torch.testing.assert_close(cache["blocks.1.attn.hook_rot_k"], cache["blocks.1.attn.hook_k"], atol=0, rtol=0)
    assert (cache["blocks.0.attn.hook_rot_q"] - cache["blocks.0.attn.hook_q"]).abs().max() > 1e-3


@pytest.mark.parametrize("shape", list(SHAPES))
def test_vision_hooks_edit_the_tower_and_projector(shape):
    hf, model = _pair(shape)
    inputs = _cases(shape)["left_padded_batch"]
    assert_split_image_edits_match_hf(model, hf, inputs, hf.model.vision_tower.encoder.layers,
                                      lambda layer: layer.self_attn.out_proj, hf.model.multi_modal_projector)


def test_logit_scale_and_centred_final_norm_in_the_readout():
    """W_U holds the final norm's weight and the logit scale: ln_final(resid) @ W_U is the logits; the lens
    read-out (centred, scaled) gives them too."""
    from vlens.lens.readout import LensReadout

    hf, model = _pair("gqa_window4_shuffle3")
    inputs = _cases("gqa_window4_shuffle3")["one_image"]
    logits, cache = model.run_with_cache(inputs)
    resid = cache[f"blocks.{model.cfg.n_layers - 1}.hook_resid_post"]
    torch.testing.assert_close(model.ln_final(resid) @ model.W_U, logits, atol=1e-5, rtol=0)
    torch.testing.assert_close(LensReadout.from_model(model).logits(resid), logits, atol=1e-5, rtol=0)


def test_no_hooks_left_after_exception():
    _, model = _pair("mqa_window6")
    assert_no_hooks_left_after_exception(model, _cases("mqa_window6")["one_image"],
                                         ["blocks.1.attn.hook_pattern", "blocks.0.ln1.hook_normalized",
                                          "vision.blocks.0.hook_resid_post", "vision.blocks.1.attn.hook_z",
                                          "vision.hook_tile_embeds"])


def test_saved_checkpoint_loads_with_its_processor(tmp_path):
    """The folder's processor comes back as the one that returns image_sizes (the tile layout needs them)."""
    from vlens import HookedVLM
    from vlens.core.architectures.aya_vision import AyaVisionImageTextProcessor

    hf, model = _pair("gqa_window4_shuffle3")
    assert_saved_checkpoint_loads(hf, model.processor, tmp_path, [random_image(48, 48, 1), random_image(96, 40, 2)])
    loaded = HookedVLM.from_pretrained(str(tmp_path))
    assert isinstance(loaded.processor, AyaVisionImageTextProcessor)
    inputs = loaded.prepare(images=[random_image(96, 40, 2)], prompts=["red"])
    assert inputs.extra["image_sizes"].tolist() == [[40, 96]]
    assert [r.kind for r in inputs.regions.tiles[0][0]] == ["tile", "tile", "base"]  # 2 x 1 tiles of 30 px


def test_bf16_is_within_hfs_own_bf16_noise():
    hf, model = _pair("mqa_window6")
    assert_bf16_within_hf_noise(hf, model.processor, lambda m: input_matrix(m, SIZES)["left_padded_batch"],
                                slack=1.0)


def test_bad_inputs_are_refused():
    _, model = _pair("mqa_window6")
    inputs = _cases("mqa_window6")["one_image"]
    with pytest.raises(UserInputError, match="no CLS token"):
        model.adapter.check_inputs(model.cfg, dataclasses.replace(
            inputs, extra={**inputs.extra, "vision_feature_select_strategy": "default"}))
    with pytest.raises(UserInputError, match="must be square"):
        model.adapter.check_inputs(model.cfg, dataclasses.replace(inputs, pixel_values=inputs.pixel_values[..., :21]))


def test_hf_processor_layout_is_got_ocr2s_canvas():
    """The processor's tile counts are GotOcr2's canvas (closest aspect ratio within the tile budget), as the
    regions read them back: a 90 x 40 image -> 2 x 1 tiles + thumbnail, 30 x 75 -> 1 x 2 (+ thumbnail)."""
    from transformers.models.got_ocr2.image_processing_pil_got_ocr2 import get_optimal_tiled_canvas

    _, model = _pair("mqa_window6")
    for width, height in ((90, 40), (30, 75), (24, 24), (100, 100)):
        inputs = model.prepare(images=[random_image(width, height, 3)], prompts=["red"])
        cols, rows = get_optimal_tiled_canvas((height, width), (24, 24), 1, 4)
        records = inputs.regions.tiles[0][0]
        expected = 1 if rows * cols == 1 else rows * cols + 1
        assert inputs.pixel_values.shape[0] == expected == len(records)
        if expected > 1:
            assert records[0].layout_grid == (rows, cols)


def test_circuits_refuse_parallel_blocks_with_the_reason():
    """The circuit graph's MLP reads its own layer's heads (resid_mid); Cohere2's MLP does not: refused up front."""
    from vlens.circuits.graph import require_sequential_blocks

    _, model = _pair("mqa_window6")
    with pytest.raises(UserInputError, match="in parallel from one norm"):
        require_sequential_blocks(model)

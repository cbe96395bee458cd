"""LFM2-VL in HookedVLM: the parity matrix against HF eager on tiny shapes, plus what is its own: the short
convolutions as hooked components (gates, values, conv input / output, per-channel-group heads, conv state while
decoding), SigLIP2 NaFlex tiles with a thumbnail as regions and markers, and the torchvision-free processor's
layout arithmetic."""

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
from vlens.testing import random_image

torch.set_num_threads(1)

# attention first and last around a conv layer (kernel 3, GQA 2:1); conv first with kernel 4 and biases, MQA,
# 3 vision heads, no projector LayerNorm
SHAPES = {
    "attn_conv_attn": dict(n_layers=3, full_attn_idxs=(0, 2)),
    "conv_attn_k4_bias": dict(n_layers=2, d_model=36, n_heads=3, n_kv_heads=1, d_mlp=44, full_attn_idxs=(1,),
                              conv_kernel=4, conv_bias=True, vision_heads=3, vision_width=18, vision_depth=3,
                              projector_use_layernorm=False),
}
# (width, height): 40 x 60 and 64 x 32 are cut into tiles (+ thumbnail), the others are one tile each
IMAGE_SIZES = [(40, 60), (64, 32), (24, 16), (16, 16), (20, 28), (48, 48)]


@functools.lru_cache(maxsize=2)
def _pair(shape: str):
    from vlens import HookedVLM
    from vlens.testing import tiny_lfm2_vl_model, tiny_lfm2_vl_processor

    hf = tiny_lfm2_vl_model(seed=len(shape), **SHAPES[shape])
    return hf, HookedVLM.from_hf(hf, processor=tiny_lfm2_vl_processor())


@functools.lru_cache(maxsize=2)
def _cases(shape: str) -> dict:
    return input_matrix(_pair(shape)[1], IMAGE_SIZES)


@pytest.mark.parametrize("shape", list(SHAPES))
def test_logits_match_hf_eager(shape):
    hf, model = _pair(shape)
    assert model.cfg.layer_types == hf.config.text_config.layer_types
    assert model.cfg.linear_attention_layers == [i for i, t in enumerate(model.cfg.layer_types) if t == "conv"]
    assert_logits_match(model, hf, _cases(shape))


def test_processor_layout_is_hfs_arithmetic():
    """Hand-computed layouts with HF's defaults (16 px patches, factor 2, 512 px tiles, 64..256 tokens, 2..10
    tiles, tolerance 2): smart_resize keeps multiples of 32 px within [64, 256] tokens; an image over twice the
    budget is split into the tile grid nearest its aspect ratio."""
    from vlens.core.architectures.lfm2_vl_processor import Lfm2VlImageProcessorPil

    ip = Lfm2VlImageProcessorPil()
    assert ip.max_num_patches == 1024  # max(256 * 4, (512 / 16)^2)
    # 300 x 200 (h x w): rounds to 288 x 192 (54 tokens < 64), so scaled up by sqrt(65536 / 60000) and ceiled
    assert ip.smart_resize(300, 200) == (320, 224) and ip.tokens(320, 224) == 70
    # 600 x 400: 18.75 -> 19 and 12.5 -> 12 multiples of 32 (Python's round, half to even, as HF's), 228 tokens
    assert ip.split_layout(600, 400) == (1, 1, (608, 384))
    # 1000 x 3000: 992 x 3008 px > 2 x 262144, split; aspect 3 -> 1 row x 3 cols (no other grid of at most 10
    # tiles has aspect 3); the thumbnail scaled down to 256 tokens: beta = sqrt(3e6 / 262144),
    # floor(1000 / beta / 32) * 32 = 288, floor(3000 / beta / 32) * 32 = 864
    assert ip.split_layout(1000, 3000) == (1, 3, (288, 864))
    # 1024 x 1024: aspect 1 -> 2 x 2 ((3, 3) ties but 1024^2 < 0.5 x 9 x 512^2)
    assert ip.split_layout(1024, 1024)[:2] == (2, 2)
    assert ip.tokens(512, 512) == 256


def test_processor_patches_tiles_and_placeholders():
    """Tiles are patchified row by row (patch rows, columns, then the patch's pixels, channels last) and
    padded; each image's placeholder text follows HF's `_build_image_tokens`."""
    from vlens.testing import tiny_lfm2_vl_processor

    processor = tiny_lfm2_vl_processor()
    ip = processor.image_processor
    image = random_image(40, 60, 1)
    layout = ip.layout(image)
    assert (layout["rows"], layout["cols"], layout["size"]) == (2, 1, (24, 16))
    out = processor(text=["<image>red"], images=[image])
    assert out["pixel_values"].shape == (3, ip.max_num_patches, 3 * 16)
    assert out["spatial_shapes"].tolist() == [[4, 4], [4, 4], [6, 4]]
    assert out["pixel_attention_mask"].sum(-1).tolist() == [16, 16, 24]
    tile = ip._pixels(layout["tiles"][1])  # [3, 16, 16]
    patch = out["pixel_values"][1, 1 * 4 + 2].reshape(4, 4, 3)  # patch (1, 2) of the second tile
    torch.testing.assert_close(patch, tile[:, 4:8, 8:12].permute(1, 2, 0))
    tokens = processor.tokenizer.convert_ids_to_tokens(out["input_ids"][0])
    assert tokens == ["<|image_start|>", "<|img_row_1_col_1|>", *["<image>"] * 4, "<|img_row_2_col_1|>",
                      *["<image>"] * 4, "<|img_thumbnail|>", *["<image>"] * 6, "<|image_end|>", "red"]


def test_tiles_thumbnail_regions_and_markers():
    """Each tiled image: its tiles (layout cells of the rows x cols grid) then its thumbnail (the "base" view,
    the image's grid); a one-tile image is one "image" grid; start / tile tags / thumbnail tag / end are markers."""
    _, model = _pair("attn_conv_attn")
    inputs = _cases("attn_conv_attn")["one_image"]
    tokens = model.tokenizer.convert_ids_to_tokens(inputs.input_ids[0])
    assert inputs.pixel_entries == [3]
    assert inputs.regions.image_grid == [[(3, 2)]]
    records = inputs.regions.tiles[0][0]
    assert [(r.kind, r.layout, r.layout_grid, r.grid) for r in records] == [
        ("tile", (0, 0), (2, 1), (2, 2)), ("tile", (1, 0), (2, 1), (2, 2)), ("base", None, None, (3, 2))]
    assert all(tokens[int(p)] == "<image>" for r in records for p in r.positions)
    marks = inputs.regions.markers[0][0]
    assert [(m.kind, tokens[int(m.positions)]) for m in marks] == [
        ("start", "<|image_start|>"), ("tile_tag", "<|img_row_1_col_1|>"), ("tile_tag", "<|img_row_2_col_1|>"),
        ("global_tag", "<|img_thumbnail|>"), ("end", "<|image_end|>")]
    # 64 x 32: 1 x 2 tiles + an 8 x 24 px thumbnail (smart_resize: beta = sqrt(2048 / 384), floor to 8 px); 24 x 16
    two = _cases("attn_conv_attn")["two_images_different_sizes"]
    assert two.pixel_entries == [3, 1] and two.regions.image_grid == [[(1, 3), (2, 3)]]
    assert [r.kind for r in two.regions.tiles[0][1]] == ["image"]
    # the left tile of the 64 x 32 image covers its left half: its top-left cell is the image's (0..16, 0..16)
    box = two.regions.token_box(0, int(two.regions.tiles[0][0][0].positions[0]))
    assert box == pytest.approx((0.0, 0.0, 16.0, 16.0))


def test_selecting_rows_keeps_each_images_tiles():
    hf, model = _pair("attn_conv_attn")
    batch = model.prepare(images=[random_image(16, 16, 4), random_image(40, 60, 1)], prompts=["red", "blue ?"])
    row = batch.select_rows([1])
    assert row.pixel_entries == [3] and row.pixel_values.shape[0] == 3
    assert row.extra["spatial_shapes"].tolist() == [[4, 4], [4, 4], [6, 4]]
    with torch.no_grad():
        torch.testing.assert_close(model(row), hf(**row.to_hf_kwargs()).logits, atol=1e-4, rtol=0)


@pytest.mark.parametrize("case", ["left_padded_batch", "two_images_different_sizes", "mixed_batch_with_text_only_row"])
def test_greedy_generate_matches_hf(case):
    """Decoding carries each conv layer's state (HF's causal_conv1d_update) and the attention KV cache."""
    hf, model = _pair("conv_attn_k4_bias")
    assert_generate_matches_hf(model, hf, _cases("conv_attn_k4_bias")[case], max_new_tokens=6)


def test_hooks_have_transformerlens_shapes_and_heads_add_up():
    _, model = _pair("attn_conv_attn")
    inputs = _cases("attn_conv_attn")["left_padded_batch"]
    cache = assert_hook_shapes(model, inputs)
    b, p = inputs.input_ids.shape
    heads = (b, p, model.cfg.linear_n_heads, model.cfg.linear_d_head)
    for name in ("b", "c", "x", "conv_in", "conv_out", "z"):
        assert tuple(cache[f"blocks.1.attn.hook_{name}"].shape) == heads
    assert tuple(cache["blocks.1.attn.hook_result"].shape) == (*heads[:3], model.cfg.d_model)
    torch.testing.assert_close(cache["blocks.1.attn.hook_z"],
                               cache["blocks.1.attn.hook_c"] * cache["blocks.1.attn.hook_conv_out"])
    n_tiles = inputs.pixel_values.shape[0]
    assert tuple(cache["vision.blocks.1.hook_resid_post"].shape) == (n_tiles, 24, 24)
    assert tuple(cache["vision.blocks.1.attn.hook_z"].shape) == (n_tiles, 24, 2, 12)
    assert tuple(cache["vision.hook_image_features"].shape) == (n_tiles, 24, 24)
    assert_head_decomposition(model, inputs)


@pytest.mark.parametrize("shape", list(SHAPES))
def test_head_edits_equal_hf(shape):
    """hook_z on an attention layer and on a conv layer (a channel group before out_proj); a score edit."""
    hf, model = _pair(shape)
    inputs = _cases(shape)["left_padded_batch"]
    conv, attn = model.cfg.linear_attention_layers[0], [i for i in range(model.cfg.n_layers)
                                                       if not model.cfg.is_linear_attention(i)][0]
    assert_hook_z_edit_matches_hf(model, hf, inputs, layer=conv, head=1)
    assert_hook_z_edit_matches_hf(model, hf, inputs, layer=attn, head=2)
    assert_scores_edit_matches_scaling_q(model, hf, inputs, layer=attn, head=1)


@pytest.mark.parametrize("port", ["b", "c", "x"])
def test_conv_input_edits_equal_hf(port):
    """Scaling one head's gate / values equals scaling those channels of HF's in_proj output, and changes the
    output; a conv-output edit equals the same edit on HF's conv (so the state read while decoding is HF's)."""
    hf, model = _pair("conv_attn_k4_bias")
    inputs = _cases("conv_attn_k4_bias")["left_padded_batch"]
    d, head, d_model = model.cfg.linear_d_head, 2, model.cfg.d_model
    offset = {"b": 0, "c": d_model, "x": 2 * d_model}[port] + head * d
    hf_conv = hf.model.language_model.layers[0].conv

    def ours_edit(act, hook):
        act = act.clone()
        act[:, :, head] = act[:, :, head] * -3.0 + 1.0
        return act

    def hf_edit(module, args, out):
        out = out.clone()
        out[..., offset:offset + d] = out[..., offset:offset + d] * -3.0 + 1.0
        return out

    with torch.no_grad():
        ours = model.run_with_hooks(inputs, fwd_hooks=[(f"blocks.0.attn.hook_{port}", ours_edit)])
    torch.testing.assert_close(ours, hf_logits(hf, inputs, forward_hooks=[(hf_conv.in_proj, hf_edit)]),
                               atol=1e-4, rtol=0)
    assert (ours - model(inputs)).abs().max() > 1e-4


def test_conv_output_edit_equals_hf():
    hf, model = _pair("conv_attn_k4_bias")
    inputs = _cases("conv_attn_k4_bias")["left_padded_batch"]
    d, head = model.cfg.linear_d_head, 1
    module = __import__(type(hf.model.language_model.layers[0].conv).__module__, fromlist=["x"])
    original = module.causal_conv1d_forward

    def edited(*args, **kwargs):
        out = original(*args, **kwargs).clone()
        out[:, head * d:(head + 1) * d] += 0.3
        return out

    def ours_edit(act, hook):
        act = act.clone()
        act[:, :, head] += 0.3
        return act

    with torch.no_grad():
        ours = model.run_with_hooks(inputs, fwd_hooks=[("blocks.0.attn.hook_conv_out", ours_edit)])
    module.causal_conv1d_forward = edited
    try:
        expected = hf_logits(hf, inputs)
    finally:
        module.causal_conv1d_forward = original
    torch.testing.assert_close(ours, expected, atol=1e-4, rtol=0)


@pytest.mark.parametrize("shape", list(SHAPES))
def test_vision_hooks_edit_the_tower_and_projector(shape):
    """A vision block's output, one vision head, the tower output the projector reads and the projector's
    output: each edit equals HF with the same edit."""
    hf, model = _pair(shape)
    inputs = _cases(shape)["left_padded_batch"]
    tower = hf.model.vision_tower
    plain = model(inputs)

    def check(name, fn, expected):
        with torch.no_grad():
            ours = model.run_with_hooks(inputs, fwd_hooks=[(name, fn)])
        torch.testing.assert_close(ours, expected, atol=1e-4, rtol=0)
        assert (ours - plain).abs().max() > 1e-4, name

    check("vision.blocks.0.hook_resid_post", lambda x, hook: x.roll(1, -1),
          hf_logits(hf, inputs, forward_hooks=[(tower.encoder.layers[0], lambda m, a, out: out.roll(1, -1))]))
    width = tower.config.hidden_size // tower.config.num_attention_heads

    def drop_head(z, hook):
        z = z.clone()
        z[..., 1, :] = 0
        return z

    def drop_head_hf(module, args):
        x = args[0].clone()
        x[..., width:2 * width] = 0
        return (x,)

    check("vision.blocks.1.attn.hook_z", drop_head,
          hf_logits(hf, inputs, pre_hooks=[(tower.encoder.layers[1].self_attn.out_proj, drop_head_hf)]))
    check("vision.hook_image_features", lambda x, hook: x.roll(1, -1),
          hf_logits(hf, inputs, forward_hooks=[(tower.post_layernorm, lambda m, a, out: out.roll(1, -1))]))
    check("vision.hook_image_embeds", lambda x, hook: x * 0,
          hf_logits(hf, inputs, forward_hooks=[(hf.model.multi_modal_projector, lambda m, a, out: out * 0)]))


def test_no_hooks_left_after_exception():
    _, model = _pair("attn_conv_attn")
    assert_no_hooks_left_after_exception(model, _cases("attn_conv_attn")["one_image"],
                                         ["blocks.1.attn.hook_conv_in", "blocks.0.attn.hook_pattern",
                                          "vision.blocks.0.hook_resid_post", "vision.hook_image_features"])


def test_saved_checkpoint_loads_with_its_processor(tmp_path):
    """The folder's processor is rebuilt without torchvision (HF's LFM2-VL image processor needs it)."""
    from vlens import HookedVLM
    from vlens.core.architectures.lfm2_vl_processor import Lfm2VlImageTextProcessor

    hf, model = _pair("conv_attn_k4_bias")
    assert_saved_checkpoint_loads(hf, model.processor, tmp_path, [random_image(40, 60, 1), random_image(16, 16, 2)])
    loaded = HookedVLM.from_pretrained(str(tmp_path))
    assert isinstance(loaded.processor, Lfm2VlImageTextProcessor)
    assert loaded.processor.image_processor.tile_size == 16


def test_bf16_is_within_hfs_own_bf16_noise():
    hf, model = _pair("attn_conv_attn")
    assert_bf16_within_hf_noise(hf, model.processor, lambda m: input_matrix(m, IMAGE_SIZES)["left_padded_batch"],
                                slack=1.0)


def test_image_size_sets_the_token_budget_and_tiles():
    """--image-size: at most image_size^2 px for a whole image (or thumbnail), tiles of the tower's side while two fit."""
    from vlens.core.devices import configure_resolution
    from vlens.testing import tiny_lfm2_vl_processor
    from vlens.utils.errors import UserInputError

    ip = configure_resolution(tiny_lfm2_vl_processor(), image_size=32).image_processor
    assert (ip.max_image_tokens, ip.max_tiles, ip.do_image_splitting) == (16, 4, True)
    assert ip.split_layout(32, 32) == (1, 1, (32, 32))  # 16 tokens: within the budget, one tile
    ip = configure_resolution(tiny_lfm2_vl_processor(), image_size=24).image_processor
    assert (ip.max_image_tokens, ip.do_image_splitting) == (9, False)
    with pytest.raises(UserInputError, match="multiple of 8"):
        configure_resolution(tiny_lfm2_vl_processor(), image_size=30)
    with pytest.raises(UserInputError, match="pixel budget"):
        configure_resolution(tiny_lfm2_vl_processor(), max_pixels=1024)

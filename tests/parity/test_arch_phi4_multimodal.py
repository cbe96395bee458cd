"""Phi-4-multimodal (vision path) in HookedVLM: the parity matrix against HF eager on tiny shapes through vlens's
torchvision-free processor (HF's `image_pixel_values` key), the HD crop layout's arithmetic, the regions of its
sub-image crops / newline / separator / global view, and what is refused (audio, LoRA on the fused qkv_proj)."""

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
    hf_logits,
    input_matrix,
)
from vlens.testing import random_image

torch.set_num_threads(1)

# GQA 2:1 with 60% rotary, 3 vision blocks (features from the second-last); MQA with 3 heads of 12, rotary on
# half, 3 vision heads, features from the last block, 24 px crops of 4 px patches (6 x 6: b = 3, odd pooled side)
SHAPES = {
    "gqa_r06": dict(),
    "mqa_r05_crop24": dict(d_model=36, n_heads=3, n_kv_heads=1, d_mlp=44, partial_rotary_factor=0.5,
                           vision_heads=3, vision_width=18, vision_depth=2, feature_layer=-1, crop_size=24),
}
# (width, height) with 16 px crops and at most 4: 40 x 20 -> 2 x 1 crops (3 x 2 = 6 > 4: nearest aspect);
# 16 x 16 -> 1 crop; 24 x 40 -> 2 x 3 > 4 -> 1 x 2; 30 x 30 -> 2 x 2; 20 x 36 -> 2 x 3 -> 1 x 2; 48 x 16 -> 3 x 1
IMAGE_SIZES = [(40, 20), (16, 16), (24, 40), (30, 30), (20, 36), (48, 16)]


@functools.lru_cache(maxsize=2)
def _pair(shape: str):
    from vlens import HookedVLM
    from vlens.testing import tiny_phi4_multimodal_model, tiny_phi4_multimodal_processor

    settings = SHAPES[shape]
    hf = tiny_phi4_multimodal_model(seed=len(shape), **settings)
    processor = tiny_phi4_multimodal_processor(crop_size=settings.get("crop_size", 16))
    return hf, HookedVLM.from_hf(hf, processor=processor)


@functools.lru_cache(maxsize=2)
def _cases(shape: str) -> dict:
    return input_matrix(_pair(shape)[1], IMAGE_SIZES)


@pytest.mark.parametrize("shape", list(SHAPES))
def test_logits_match_hf_eager(shape):
    hf, model = _pair(shape)
    assert model.cfg.d_head * model.cfg.n_heads == model.cfg.d_model
    assert_logits_match(model, hf, _cases(shape))


def test_prepared_inputs_carry_hfs_key():
    """vlens holds the crops as pixel_values and hands them to HF as image_pixel_values; HF's own processor
    output (image_pixel_values) is read the same way, and both keys at once are refused."""
    from vlens.utils.errors import UserInputError

    hf, model = _pair("gqa_r06")
    inputs = _cases("gqa_r06")["two_images_different_sizes"]
    kwargs = inputs.to_hf_kwargs()
    assert "pixel_values" not in kwargs and kwargs["image_pixel_values"].shape == (2, 3, 3, 16, 16)
    raw = model.processor(text=["<|image|>red"], images=[random_image(40, 20, 1)])
    assert "image_pixel_values" in raw and "pixel_values" not in raw
    with torch.no_grad():
        torch.testing.assert_close(model(dict(raw)), hf(**raw).logits, atol=1e-4, rtol=0)
        with pytest.raises(UserInputError, match="pass one of them"):
            model(dict(raw, pixel_values=raw["image_pixel_values"]))


def test_processor_layout_is_hfs_arithmetic():
    """Hand-computed layouts with HF's defaults (448 px crops, 14 px patches, at most 36 crops)."""
    from vlens.core.architectures.phi4_multimodal_processor import Phi4MultimodalImageProcessorTorch

    ip = Phi4MultimodalImageProcessorTorch()
    assert (ip.mask_size, ip.base) == (32, 16)
    # 1000 x 600 (w x h): 3 x 2 crops; 1344 / 1000 < 896 / 600, so resized to 1344 x int(600 * 1.344) = 806,
    # 90 px of padding below: its last floor(90 / 14) = 6 patch rows masked; the bottom crop's pooled rows
    # 0, 2, ..., 30 lose 26, 28, 30: 16 + 13 = 29 kept rows of 48 cells
    layout = ip.layout(600, 1000)
    assert (layout["cols"], layout["rows"], layout["resized"], layout["padding"]) == (3, 2, (1344, 806), (0, 90))
    assert int(layout["mask"].sum()) == 64 * 96 - 6 * 96 and layout["kept"] == (29, 48)
    # HF's count: 256 + 1 + 29 * 48 (kept cells) + 29 (newlines) + 16
    assert layout["tokens"] == 29 * 49 + 1 + 16 * 17 == 256 + 1 + 29 * 48 + 29 + 16
    # 5000 x 400: 12 x 1 crops; 5376 / 5000 = 1.0752 < 448 / 400, so resized to 5376 x int(400 * 1.0752) = 430
    layout = ip.layout(400, 5000)
    assert (layout["cols"], layout["rows"], layout["resized"], layout["padding"]) == (12, 1, (5376, 430), (0, 18))
    # 18 px: one patch row masked, pooled row 31 not read: all 16 rows kept
    assert layout["kept"] == (16, 192)
    # 3000 x 3000: 7 x 7 = 49 > 36 crops: aspect 1 -> the square grid nearest; (1, 1) first, later squares
    # (2, 2) ... (6, 6) tie and win while the image covers more than half their area (6 x 6: 0.5 * 36 * 448^2
    # = 3.6e6 < 9e6)
    assert ip.layout(3000, 3000)["cols"] == ip.layout(3000, 3000)["rows"] == 6
    from vlens.utils.errors import UserInputError
    with pytest.raises(UserInputError, match="aspect ratio"):
        ip.layout(5, 4000)  # 4032 x int(5 * 1.008) = 5 px: under HF's 10 px


def test_processor_pixels_masks_and_placeholders():
    """A 32 x 12 red image with 16 px crops: 2 x 1 crops, resized 32 x 12 (no change), 4 px of white below
    (one patch row masked, pooled rows 0 and 2 kept: 2 x 4 cells); the crops hold the red image over white,
    normalised to [-1, 1]; the global view is the canvas resized to 16 x 16; 2 * 5 + 1 + 2 * 3 placeholders."""
    import numpy as np
    import torch.nn.functional as F
    from PIL import Image

    from vlens.testing import tiny_phi4_multimodal_processor

    processor = tiny_phi4_multimodal_processor()
    image = Image.fromarray(np.tile(np.array([255, 0, 0], dtype=np.uint8), (12, 32, 1)))
    out = processor(text=["<|image|>red"], images=[image])
    pixels = out["image_pixel_values"][0]
    assert pixels.shape == (3, 3, 16, 16) and out["image_sizes"].tolist() == [[16, 32]]
    canvas = torch.ones(3, 16, 32)
    canvas[1:, :12] = -1.0  # red: (1, -1, -1) above, white (1, 1, 1) below
    torch.testing.assert_close(pixels[1], canvas[:, :, :16])
    torch.testing.assert_close(pixels[2], canvas[:, :, 16:])
    global_view = F.interpolate(canvas[None], size=(16, 16), mode="bicubic", align_corners=False)[0]
    torch.testing.assert_close(pixels[0], global_view)
    mask = out["image_attention_mask"][0]
    assert mask[0].all() and mask[1, :3].all() and not mask[1, 3].any() and not mask[2, 3].any()
    tokens = processor.tokenizer.convert_ids_to_tokens(out["input_ids"][0])
    assert tokens == ["<|image|>"] * 17 + ["red"]
    with pytest.raises(Exception, match="audio"):
        processor(text=["<|audio|>red"], audio=[torch.zeros(10)])


def test_crop_padding_across_images_and_selected_rows():
    """Images with fewer crops than the batch's most are padded with zero crops (masks of ones), as HF pads;
    selecting rows keeps each image's crops, sizes and masks."""
    hf, model = _pair("gqa_r06")
    batch = model.prepare(images=[random_image(16, 16, 4), random_image(30, 30, 1)], prompts=["red", "blue ?"])
    assert batch.pixel_values.shape[:2] == (2, 5) and batch.pixel_entries == [1, 1]
    assert not batch.pixel_values[0, 2:].any() and batch.extra["image_attention_mask"][0, 2:].all()
    row = batch.select_rows([1])
    assert row.extra["image_sizes"].tolist() == [[32, 32]] and row.pixel_values.shape[:2] == (1, 5)
    with torch.no_grad():
        torch.testing.assert_close(model(row), hf(**row.to_hf_kwargs()).logits, atol=1e-4, rtol=0)


def test_regions_crops_newlines_separator_global_view():
    """Every image token in one record: the crops' kept cells (row-interleaved across crops, as HF packs them),
    the newline features after every row of both grids, the separator, the global view (the image's grid)."""
    _, model = _pair("gqa_r06")
    inputs = _cases("gqa_r06")["one_image"]
    # 40 x 20 -> 2 x 1 crops of 2 x 2 pooled cells: 2 rows of 4 cells + newline, separator, 2 x (2 + 1)
    records = inputs.regions.tiles[0][0]
    assert [(r.kind, r.grid, r.layout, r.index, r.spatial) for r in records] == [
        ("tile", (2, 2), (0, 0), 1, True), ("tile", (2, 2), (0, 1), 2, True), ("newline", (4, 1), None, 0, False),
        ("separator", (1, 1), None, 0, False), ("base", (2, 2), None, 0, True)]
    first = int(inputs.regions.images[0][0][0])
    relative = [(r.positions - first).tolist() for r in records]
    assert relative == [[0, 1, 5, 6], [2, 3, 7, 8], [4, 9, 13, 16], [10], [11, 12, 14, 15]]
    assert inputs.regions.image_grid[0] == [(2, 2)]
    assert inputs.regions.image_view(0, 0).kind == "base"
    # the global view covers the whole 40 x 20 image (the canvas is 32 x 16: no padding); the left crop's
    # top-left cell its top-left 10 x 10 px
    base = inputs.regions.image_view(0, 0)
    assert inputs.regions.token_box(0, int(base.positions[0])) == pytest.approx((0.0, 0.0, 20.0, 10.0))
    assert inputs.regions.token_box(0, int(records[0].positions[0])) == pytest.approx((0.0, 0.0, 10.0, 10.0))
    assert inputs.regions.token_box(0, int(records[1].positions[3])) == pytest.approx((30.0, 10.0, 40.0, 20.0))


def test_padded_crop_rows_are_dropped_from_the_regions():
    """A 48 x 16 image with 24 px crops: 2 x 1 crops, resized 48 x 16 (8 px padding below: 2 patch rows of 6
    masked, pooled rows 0, 2 kept, 4 not): 2 x 6 kept cells of the 3 x 6 crop grid."""
    _, model = _pair("mqa_r05_crop24")
    inputs = model.prepare(images=[random_image(48, 16, 3)], prompts=["red"])
    records = inputs.regions.tiles[0][0]
    assert [(r.kind, r.grid) for r in records] == [("tile", (2, 3)), ("tile", (2, 3)), ("newline", (5, 1)),
                                                  ("separator", (1, 1)), ("base", (3, 3))]
    assert sum(len(r.positions) for r in records) == 2 * 7 + 1 + 3 * 4 == len(inputs.regions.images[0][0])


@pytest.mark.parametrize("case", ["left_padded_batch", "two_images_different_sizes", "mixed_batch_with_text_only_row"])
def test_greedy_generate_matches_hf(case):
    hf, model = _pair("mqa_r05_crop24")
    assert_generate_matches_hf(model, hf, _cases("mqa_r05_crop24")[case], max_new_tokens=6)


def test_hooks_have_transformerlens_shapes_and_heads_add_up():
    _, model = _pair("gqa_r06")
    inputs = _cases("gqa_r06")["left_padded_batch"]
    assert_hook_shapes(model, inputs)
    assert_head_decomposition(model, inputs)


@pytest.mark.parametrize("shape", list(SHAPES))
def test_head_edits_equal_hf(shape):
    """hook_z equals the same edit on HF's o_proj input; a score edit equals scaling that head's rows of the
    fused qkv_proj's q part (after partial rotary)."""
    hf, model = _pair(shape)
    inputs = _cases(shape)["left_padded_batch"]
    assert_hook_z_edit_matches_hf(model, hf, inputs, layer=1, head=2)
    d, head, beta = model.cfg.d_head, 1, 1.7

    def scale_scores(scores, hook):
        scores = scores.clone()
        scores[:, head] = scores[:, head] * beta
        return scores

    def scale_q(module, args, output):  # the head's query rows of the fused projection (rotary is linear)
        output = output.clone()
        output[..., head * d:(head + 1) * d] *= beta
        return output

    with torch.no_grad():
        ours = model.run_with_hooks(inputs, fwd_hooks=[("blocks.0.attn.hook_attn_scores", scale_scores)])
        plain = model(inputs)
    expected = hf_logits(hf, inputs, forward_hooks=[(hf.model.layers[0].self_attn.qkv_proj, scale_q)])
    torch.testing.assert_close(ours, expected, atol=1e-4, rtol=0)
    assert (ours - plain).abs().max() > 1e-4


def test_vision_head_and_projector_input_edits_equal_hf():
    """Zeroing one SigLIP head (vision hook_z) equals zeroing its out_proj input columns in HF; scaling the pooled
    features (hook_image_features) equals scaling HF's image_token_compression output."""
    hf, model = _pair("gqa_r06")
    inputs = _cases("gqa_r06")["one_image"]
    tower = hf.model.embed_tokens_extend.image_embed
    d = tower.img_processor.config.hidden_size // 2

    def zero_head(act, hook):
        act = act.clone()
        act[:, :, 1] = 0
        return act

    def hf_zero(module, args):
        x = args[0].clone()
        x[..., d:2 * d] = 0
        return (x,)

    def scale(act, hook):
        return act * 1.5

    with torch.no_grad():
        ours = model.run_with_hooks(inputs, fwd_hooks=[("vision.blocks.0.attn.hook_z", zero_head)])
        theirs = hf_logits(hf, inputs, pre_hooks=[(tower.img_processor.encoder.layers[0].self_attn.out_proj, hf_zero)])
        torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=0)
        assert (ours - model(inputs)).abs().max() > 1e-3
        ours = model.run_with_hooks(inputs, fwd_hooks=[("vision.hook_image_features", scale)])
        theirs = hf_logits(hf, inputs, forward_hooks=[(tower.image_token_compression, lambda m, a, o: o * 1.5)])
        torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=0)


def test_no_hooks_left_after_exception():
    _, model = _pair("gqa_r06")
    assert_no_hooks_left_after_exception(model, _cases("gqa_r06")["one_image"],
                                         ["blocks.0.attn.hook_z", "vision.hook_image_features"])


def test_saved_checkpoint_loads_with_its_processor(tmp_path):
    hf, model = _pair("gqa_r06")
    assert_saved_checkpoint_loads(hf, model.processor, tmp_path, [random_image(40, 20, 1), random_image(16, 16, 2)])


def test_bf16_is_within_hfs_own_bf16_noise():
    hf, model = _pair("gqa_r06")
    assert_bf16_within_hf_noise(hf, model.processor, lambda m: input_matrix(m, IMAGE_SIZES)["left_padded_batch"])


def test_audio_inputs_are_refused():
    from vlens.utils.errors import UserInputError

    _, model = _pair("gqa_r06")
    inputs = _cases("gqa_r06")["one_image"]
    with pytest.raises(UserInputError, match="audio inputs are not supported"):
        model(input_ids=inputs.input_ids, audio_input_features=torch.zeros(1, 4, 8))


def test_vision_tower_is_bidirectional_under_hfs_sdpa_too():
    """HF's SigLIP attention here says is_causal=True, which HF's sdpa path obeys when no patch is masked (HF
    eager attends both ways, as the checkpoint's SigLIP does); vlens follows eager whichever path HF loaded."""
    from vlens import HookedVLM
    from vlens.testing import tiny_phi4_multimodal_model, tiny_phi4_multimodal_processor

    eager = tiny_phi4_multimodal_model(seed=3)
    sdpa = tiny_phi4_multimodal_model(seed=3, attn_implementation="sdpa")
    model = HookedVLM.from_hf(sdpa, processor=tiny_phi4_multimodal_processor())
    inputs = model.prepare(images=[random_image(30, 30, 1)], prompts=["red"])
    with torch.no_grad():
        expected = eager(**inputs.to_hf_kwargs()).logits
        torch.testing.assert_close(model(inputs), expected, atol=1e-4, rtol=0)
        assert (sdpa(**inputs.to_hf_kwargs()).logits - expected).abs().max() > 1e-2  # HF's sdpa: causal tower


def test_temperature_hooks_export_and_baked_checkpoint_agree():
    """A head's temperature on the fused qkv_proj: vlens's hooks, HF hooks on qkv_proj's query rows
    (export_to_hf) and a checkpoint with beta folded into those rows give the same logits."""
    import copy

    from vlens.interventions.temperature import HeadTemperature

    hf, model = _pair("gqa_r06")
    inputs = _cases("gqa_r06")["left_padded_batch"]
    temp = HeadTemperature({(0, 1): 1.4, (1, 3): 0.7})
    baked = copy.deepcopy(hf)
    baked.load_state_dict(temp.baked_state_dict(hf))
    with torch.no_grad():
        base = model(inputs)
        with temp.applied(model):
            hooked = model(inputs)
        with temp.export_to_hf(hf):
            exported = hf(**inputs.to_hf_kwargs()).logits
        theirs = baked(**inputs.to_hf_kwargs()).logits
    assert (hooked - base).abs().max() > 1e-4
    torch.testing.assert_close(exported, hooked, atol=1e-4, rtol=0)
    torch.testing.assert_close(theirs, hooked, atol=1e-4, rtol=0)
    with torch.no_grad():  # the hooks are gone and k / v rows untouched
        torch.testing.assert_close(hf(**inputs.to_hf_kwargs()).logits, base, atol=1e-4, rtol=0)


def test_lora_is_refused_with_the_reason():
    """vlens's LoRA wraps separate q / k / v nn.Linear layers and exports them under HF's names: on the fused
    qkv_proj it could not map back to the checkpoint, so it is refused by message."""
    pytest.importorskip("peft")
    from vlens import HookedVLM
    from vlens.testing import tiny_phi4_multimodal_model, tiny_phi4_multimodal_processor
    from vlens.training import add_lora
    from vlens.utils.errors import UserInputError

    model = HookedVLM.from_hf(tiny_phi4_multimodal_model(seed=5), processor=tiny_phi4_multimodal_processor())
    with pytest.raises(UserInputError, match="LoRA is not supported for phi4_multimodal: .*fused qkv_proj"):
        add_lora(model, rank=2)
    assert not any(".lora_" in name for name, _ in model.named_parameters())

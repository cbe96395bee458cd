"""LLaVA-OneVision in HookedVLM: the parity matrix against HF eager on tiny shapes (anyres_max
downscaling on and off, SigLIP and CLIP towers, Qwen2 and Llama text models), its multi-image rule
(images of a multi-image prompt are not tiled), regions read back from HF's packing, anyres edits,
its image-only processor and clear refusals (videos, a per-call aspect ratio)."""

from __future__ import annotations

import functools

import pytest
import torch

from tests.helpers.anyres_parity import (
    assert_anyres_edits_match_hf,
    assert_anyres_hooks_and_decoder_edits,
    assert_regions_follow_hf_packing,
)
from tests.helpers.arch_parity import (
    assert_generate_matches_hf,
    assert_logits_match,
    assert_no_hooks_left_after_exception,
    assert_saved_checkpoint_loads,
    input_matrix,
)
from vlens.testing import default_pinpoints, random_image
from vlens.utils.errors import UserInputError

SHAPES = {
    # SigLIP + Qwen2, anyres_max_2: large images are downscaled bilinearly, 4x4 tokens per tile
    "siglip_qwen2_max2_g4": dict(d_model=40, n_heads=5, n_kv_heads=1, tile=24, patch_size=6,
                                 vision_aspect_ratio="anyres_max_2", pinpoints=default_pinpoints(24, 3)),
    # CLIP + Llama, "default" strategy (CLS dropped), anyres_max_1, 3x3 tokens per tile
    "clip_llama_default_max1_g3": dict(d_model=48, n_heads=6, n_kv_heads=3, tile=24, patch_size=8, tower="clip",
                                       text_model="llama", vision_feature_select_strategy="default",
                                       vision_feature_layer=-2, vision_aspect_ratio="anyres_max_1",
                                       pinpoints=[[24, 24], [24, 48], [48, 24], [48, 48], [72, 48]]),
    # SigLIP + Qwen2, anyres_max_9 (no downscale at these sizes), two feature layers, 5x5 tokens per tile
    "siglip_layers_max9_g5": dict(d_model=32, n_heads=4, n_kv_heads=2, tile=20, patch_size=4,
                                  vision_aspect_ratio="anyres_max_9", vision_feature_layer=[-2, -1],
                                  vision_heads=4, pinpoints=default_pinpoints(20, 2)),
}
SIZES = [(40, 70), (90, 30), (33, 47), (64, 64), (50, 20), (28, 96)]


def _processor(kw: dict):
    from vlens.testing import tiny_llava_onevision_processor

    return tiny_llava_onevision_processor(tile=kw["tile"], patch_size=kw["patch_size"], pinpoints=kw["pinpoints"],
                                          vision_aspect_ratio=kw["vision_aspect_ratio"],
                                          strategy=kw.get("vision_feature_select_strategy", "full"),
                                          cls_token=kw.get("tower", "siglip") == "clip")


@functools.lru_cache(maxsize=4)
def _pair(shape: str):
    from vlens import HookedVLM
    from vlens.testing import tiny_llava_onevision_model

    kw = SHAPES[shape]
    hf = tiny_llava_onevision_model(seed=len(shape), **kw)
    return hf, HookedVLM.from_hf(hf, processor=_processor(kw))


@functools.lru_cache(maxsize=4)
def _cases(shape: str) -> dict:
    model = _pair(shape)[1]
    cases = input_matrix(model, SIZES)
    # HF's processor with a flat image list: both images of the prompt are tiled (batch_num_images [1, 1])
    raw = model.processor(text=["<|im_start|>user <image><image>\nred<|im_end|><|im_start|>assistant\n"],
                          images=[random_image(*SIZES[1], 7), random_image(*SIZES[5], 8)], return_tensors="pt")
    cases["two_images_tiled"] = model.coerce_inputs(raw)
    return cases


@pytest.mark.parametrize("shape", list(SHAPES))
def test_logits_match_hf_eager(shape):
    hf, model = _pair(shape)
    assert model.adapter.family == "llava_onevision" and model.cfg.video_token_id == hf.config.video_token_id
    assert_logits_match(model, hf, _cases(shape))


@pytest.mark.parametrize("shape", list(SHAPES))
def test_regions_follow_hf_packing(shape):
    hf, model = _pair(shape)
    for case in ("one_image", "two_images_different_sizes", "two_images_tiled", "left_padded_batch",
                 "mixed_batch_with_text_only_row"):
        assert_regions_follow_hf_packing(model, hf, _cases(shape)[case])


def test_images_of_a_multi_image_prompt_are_not_tiled():
    hf, model = _pair("siglip_qwen2_max2_g4")
    two = _cases("siglip_qwen2_max2_g4")["two_images_different_sizes"]
    assert two.extra["batch_num_images"].tolist() == [2]
    assert [[r.kind for r in image] for image in two.regions.tiles[0]] == [["image", "newline"]] * 2
    assert [len(p) for p in two.regions.images[0]] == [17, 17]  # 4x4 tokens + one newline each
    # the square the processor pads to: a 90 x 30 image sits 30 px below the top of a 90 px square
    assert two.regions.tiles[0][0][0].box == (0.0, -30.0, 90.0, 60.0)
    tiled = _cases("siglip_qwen2_max2_g4")["two_images_tiled"]
    assert tiled.extra["batch_num_images"].tolist() == [1, 1]
    assert all(image[0].kind == "base" and image[-1].kind == "newline" for image in tiled.regions.tiles[0])


def test_anyres_max_downscale_regions():
    """anyres_max_1 on a 2x2-tile image of 3x3-token tiles: 6x6 kept tokens, ratio sqrt(36 / 9) = 2 > 1.1,
    so HF downscales to 3x3. Output row r's centre sits at kept row (r + 0.5) * 2 = 1, 3, 5: tile row 0 keeps
    one output row, tile row 1 two (a centre on a tile border belongs to the later tile); columns alike."""
    hf, model = _pair("clip_llama_default_max1_g3")
    inputs = model.prepare(images=[random_image(48, 48, 3)], prompts=["red"])
    records = inputs.regions.tiles[0][0]
    assert [(r.kind, r.grid, r.layout) for r in records] == [
        ("base", (3, 3), None), ("tile", (1, 1), (0, 0)), ("tile", (1, 2), (0, 1)), ("tile", (2, 1), (1, 0)),
        ("tile", (2, 2), (1, 1)), ("newline", (3, 1), None)]
    assert len(inputs.regions.images[0][0]) == 9 + 3 * 3 + 3
    assert_regions_follow_hf_packing(model, hf, inputs)


@pytest.mark.parametrize("shape", ["siglip_qwen2_max2_g4", "clip_llama_default_max1_g3"])
def test_anyres_hook_edits_equal_hf_edits(shape):
    hf, model = _pair(shape)
    assert_anyres_edits_match_hf(model, hf, _cases(shape)["left_padded_batch"], vision_block=1)
    assert_anyres_edits_match_hf(model, hf, _cases(shape)["two_images_different_sizes"], vision_block=0)


@pytest.mark.parametrize("shape", list(SHAPES))
def test_decoder_hooks_and_edits(shape):
    hf, model = _pair(shape)
    assert_anyres_hooks_and_decoder_edits(model, hf, _cases(shape)["left_padded_batch"])


@pytest.mark.parametrize("case", ["left_padded_batch", "two_images_different_sizes", "two_images_tiled", "text_only",
                                  "mixed_batch_with_text_only_row"])
def test_greedy_generate_matches_hf(case):
    hf, model = _pair("siglip_qwen2_max2_g4")
    assert_generate_matches_hf(model, hf, _cases("siglip_qwen2_max2_g4")[case])


def test_prompt_format_and_no_hooks_left():
    hf, model = _pair("siglip_qwen2_max2_g4")
    inputs = model.prepare(images=[random_image(32, 32, 1)], prompts=["How many dots are there?"])
    tokens = [t for t in model.to_str_tokens(inputs.input_ids[0]) if t != "<image>"]
    assert tokens == ["<|im_start|>", "user", "How", "many", "dots", "are", "there", "?", "<|im_end|>",
                      "<|im_start|>", "assistant"]
    assert model.adapter.fallback_chat_prompt("red ?", 2) == \
        "<|im_start|>user <image><image>\nred ?<|im_end|><|im_start|>assistant\n"
    assert_no_hooks_left_after_exception(model, _cases("siglip_qwen2_max2_g4")["one_image"],
                                         ["vision.hook_image_embeds", "vision.hook_image_newline",
                                          "blocks.0.attn.hook_pattern", "vision.blocks.1.attn.hook_z"])


def test_videos_and_a_per_call_aspect_ratio_are_refused():
    hf, model = _pair("siglip_qwen2_max2_g4")
    kwargs = _cases("siglip_qwen2_max2_g4")["one_image"].to_hf_kwargs()
    with pytest.raises(UserInputError, match="videos"):
        model(**kwargs, pixel_values_videos=torch.zeros(1, 2, 3, 24, 24))
    with pytest.raises(UserInputError, match="vision_aspect_ratio"):
        model(**kwargs, vision_aspect_ratio="anyres_max_9")
    with pytest.raises(UserInputError, match="batch_num_images"):
        model(**{**kwargs, "batch_num_images": torch.tensor([2])})


def test_saved_checkpoint_loads_with_its_image_only_processor(tmp_path):
    from vlens.core.architectures.llava_onevision import LlavaOnevisionImageTextProcessor

    hf, model = _pair("siglip_qwen2_max2_g4")
    assert_saved_checkpoint_loads(hf, model.processor, tmp_path, [random_image(40, 40, 1), random_image(64, 32, 2)])
    from vlens import HookedVLM

    loaded = HookedVLM.from_pretrained(str(tmp_path))
    assert isinstance(loaded.processor, LlavaOnevisionImageTextProcessor)
    assert loaded.processor.vision_aspect_ratio == "anyres_max_2"
    assert loaded.processor.chat_template == model.processor.chat_template

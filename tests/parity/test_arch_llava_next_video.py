"""LLaVA-NeXT-Video in HookedVLM on images (LLaVA-NeXT's anyres path inside a NeXT-Video model): the parity
matrix against HF eager, anyres regions from HF's packing, hook edits, generate, hooks removed on error, a
saved folder loading back with its image-and-text processor. Its videos: tests/parity/test_video_llava.py."""

from __future__ import annotations

import functools

import pytest

from tests.helpers.anyres_parity import (
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
from tests.helpers.models import tiny_pair
from vlens.testing import random_image
from vlens.utils.errors import UserInputError

SHAPES = {
    # CLIP + Llama, "default" (CLS dropped), 3x3 tokens per tile, GQA 3:1
    "clip_llama_g3": dict(d_model=48, n_heads=6, n_kv_heads=2, tile=24, patch_size=8),
    # SigLIP ("full") + Qwen2 (q/k/v bias), 4x4 tokens per tile
    "siglip_qwen2_g4": dict(d_model=40, n_heads=5, n_kv_heads=1, tile=20, patch_size=5, tower="siglip",
                            text_model="qwen2", vision_feature_select_strategy="full", vision_feature_layer=-1,
                            vision_width=24, vision_heads=3),
}
SIZES = [(40, 70), (90, 30), (33, 47), (64, 64), (50, 20), (28, 96)]


def _pair(shape: str):
    kw = SHAPES[shape]
    clip = kw.get("tower", "clip") == "clip"
    return tiny_pair("llava_next_video", seed=len(shape), **kw,
                     processor={"strategy": kw.get("vision_feature_select_strategy", "default"), "cls_token": clip})


@functools.lru_cache(maxsize=2)
def _cases(shape: str) -> dict:
    return input_matrix(_pair(shape)[1], SIZES)


@pytest.mark.parametrize("shape", list(SHAPES))
def test_logits_regions_and_hooks_match_hf(shape):
    hf, model = _pair(shape)
    assert model.cfg.architecture == "LlavaNextVideoForConditionalGeneration"
    assert model.adapter.family == "llava_next_video" and model.cfg.video_token_id == hf.config.video_token_id
    cases = _cases(shape)
    assert_logits_match(model, hf, cases)
    for case in ("two_images_different_sizes", "left_padded_batch"):
        assert_regions_follow_hf_packing(model, hf, cases[case])
    assert_anyres_hooks_and_decoder_edits(model, hf, cases["left_padded_batch"])


def test_generate_and_no_hooks_left():
    hf, model = _pair("clip_llama_g3")
    assert_generate_matches_hf(model, hf, _cases("clip_llama_g3")["left_padded_batch"])
    assert_no_hooks_left_after_exception(model, _cases("clip_llama_g3")["one_image"],
                                         ["blocks.0.attn.hook_z", "vision.hook_image_embeds"])


def test_saved_checkpoint_loads_with_its_image_text_processor(tmp_path):
    from vlens import HookedVLM
    from vlens.core.architectures.llava_next_video import LlavaNextVideoImageTextProcessor

    hf, model = _pair("clip_llama_g3")
    assert_saved_checkpoint_loads(hf, model.processor, tmp_path, [random_image(40, 40, 1), random_image(64, 32, 2)])
    loaded = HookedVLM.from_pretrained(str(tmp_path))
    assert isinstance(loaded.processor, LlavaNextVideoImageTextProcessor)
    # a 3x3 patch grid: HF's processor writes 9 // 4 = 2 tokens per frame, its pooling makes 1x1: refused
    with pytest.raises(UserInputError, match="HF's own processor and model disagree"):
        loaded.prepare(videos=[[random_image(30, 30, k) for k in range(2)]], prompts=["red"])

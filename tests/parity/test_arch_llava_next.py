"""LLaVA-NeXT in HookedVLM: the parity matrix against HF eager on tiny shapes unlike the released
ones (tile sides, patch sizes, pinpoints, CLIP and SigLIP towers, Llama / Mistral / Qwen2 text
models), anyres regions read back from HF's own packing, and edits on every anyres hook."""

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
from vlens.testing import random_image

SHAPES = {
    # CLIP + Llama, "default" (CLS dropped), 3x3 tokens per tile
    "clip_llama_gqa3_g3": dict(d_model=48, n_heads=6, n_kv_heads=2, tile=24, patch_size=8,
                               pinpoints=[[24, 48], [48, 24], [48, 48], [72, 24], [24, 72]]),
    # SigLIP (no CLS, "full") + Qwen2 (q/k/v bias), two feature layers, 4x4 tokens per tile
    "siglip_qwen2_layers_g4": dict(d_model=40, n_heads=5, n_kv_heads=1, tile=20, patch_size=5, tower="siglip",
                                   text_model="qwen2", vision_feature_select_strategy="full",
                                   vision_feature_layer=[-3, -1], vision_width=24, vision_heads=3,
                                   pinpoints=[[20, 20], [20, 40], [40, 20], [40, 60], [60, 40]]),
    # CLIP + Mistral, head_dim unlike d_model / n_heads, wide pinpoints
    "clip_mistral_head20": dict(d_model=64, n_heads=4, n_kv_heads=4, head_dim=20, tile=32, patch_size=8,
                                text_model="mistral", vision_heads=4,
                                pinpoints=[[32, 64], [64, 32], [96, 32], [32, 96], [64, 64]]),
}
SIZES = [(40, 70), (90, 30), (33, 47), (64, 64), (50, 20), (28, 96)]  # (width, height): aspect ratios differ


@functools.lru_cache(maxsize=4)
def _pair(shape: str):
    from vlens import HookedVLM
    from vlens.testing import tiny_llava_next_model, tiny_llava_next_processor

    kw = SHAPES[shape]
    hf = tiny_llava_next_model(seed=len(shape), **kw)
    processor = tiny_llava_next_processor(tile=kw["tile"], patch_size=kw["patch_size"], pinpoints=kw["pinpoints"],
                                          strategy=kw.get("vision_feature_select_strategy", "default"),
                                          cls_token=kw.get("tower", "clip") == "clip")
    return hf, HookedVLM.from_hf(hf, processor=processor)


@functools.lru_cache(maxsize=4)
def _cases(shape: str) -> dict:
    return input_matrix(_pair(shape)[1], SIZES)


@pytest.mark.parametrize("shape", list(SHAPES))
def test_logits_match_hf_eager(shape):
    hf, model = _pair(shape)
    assert model.cfg.architecture == "LlavaNextForConditionalGeneration" and model.adapter.family == "llava_next"
    assert_logits_match(model, hf, _cases(shape))


def test_processor_output_and_hf_keywords_work():
    hf, model = _pair("clip_llama_gqa3_g3")
    raw = model.processor(text=["[INST] <image>\n<image>\nred [/INST]"],
                          images=[random_image(70, 25, 3), random_image(30, 61, 4)], return_tensors="pt")
    with torch.no_grad():
        expected = hf(**raw).logits
        torch.testing.assert_close(model(raw), expected, atol=1e-4, rtol=0)
        torch.testing.assert_close(model(**raw), expected, atol=1e-4, rtol=0)
    assert model.coerce_inputs(raw).to_hf_kwargs()["image_sizes"].tolist() == [[25, 70], [61, 30]]
    # the tiles of all images concatenated (4-D), as HF also takes them
    counts = model.adapter.tiles_per_image(model.coerce_inputs(raw))
    flat = torch.cat([image[:n] for image, n in zip(raw["pixel_values"], counts, strict=True)])
    with torch.no_grad():
        torch.testing.assert_close(model(**{**raw, "pixel_values": flat}), expected, atol=1e-4, rtol=0)


@pytest.mark.parametrize("shape", list(SHAPES))
def test_regions_follow_hf_packing(shape):
    hf, model = _pair(shape)
    for case in ("one_image", "two_images_different_sizes", "left_padded_batch", "mixed_batch_with_text_only_row"):
        assert_regions_follow_hf_packing(model, hf, _cases(shape)[case])


def test_regions_of_a_hand_computed_image():
    """An 80 x 64 image, tiles of 32 px (4 x 4 tokens), pinpoints 64 x 96: a 2 x 3 tile layout; the image
    fills 80 of the 96 px (8 px of padding each side), so unpadding keeps token columns 1..10 of 12."""
    from vlens import HookedVLM
    from vlens.testing import tiny_llava_next_model, tiny_llava_next_processor

    pinpoints = [[64, 96], [32, 32]]
    hf = tiny_llava_next_model(seed=3, tile=32, patch_size=8, pinpoints=pinpoints)
    model = HookedVLM.from_hf(hf, processor=tiny_llava_next_processor(tile=32, patch_size=8, pinpoints=pinpoints))
    inputs = model.prepare(images=[random_image(80, 64, 5)], prompts=["red"])
    records = inputs.regions.tiles[0][0]
    assert [(r.kind, r.grid, r.layout, r.index) for r in records] == [
        ("base", (4, 4), None, 0),
        ("tile", (4, 3), (0, 0), 1), ("tile", (4, 4), (0, 1), 2), ("tile", (4, 3), (0, 2), 3),
        ("tile", (4, 3), (1, 0), 4), ("tile", (4, 4), (1, 1), 5), ("tile", (4, 3), (1, 2), 6),
        ("newline", (8, 1), None, 0),
    ]
    assert [r.box for r in records[1:4]] == [(0.0, 0.0, 24.0, 32.0), (24.0, 0.0, 56.0, 32.0), (56.0, 0.0, 80.0, 32.0)]
    assert records[0].box == (0.0, 0.0, 80.0, 64.0)
    first = int(inputs.regions.images[0][0][0])
    # 16 base tokens, then 8 rows of 10 kept tokens + a newline
    assert (records[-1].positions - first).tolist() == [16 + 11 * r + 10 for r in range(8)]
    assert (records[1].positions[:4] - first).tolist() == [16, 17, 18, 27]
    assert inputs.regions.image_grid[0] == [(4, 4)]
    assert inputs.regions.image_view(0).kind == "base"
    assert inputs.regions.tile_positions(0, "newline").tolist() == records[-1].positions.tolist()
    assert len(inputs.regions.images[0][0]) == 16 + 8 * 11 == int((inputs.input_ids == model.cfg.image_token_id).sum())


@pytest.mark.parametrize("shape", ["clip_llama_gqa3_g3", "siglip_qwen2_layers_g4"])
def test_anyres_hook_edits_equal_hf_edits(shape):
    hf, model = _pair(shape)
    assert_anyres_edits_match_hf(model, hf, _cases(shape)["two_images_different_sizes"], vision_block=1)


@pytest.mark.parametrize("shape", list(SHAPES))
def test_decoder_hooks_and_edits(shape):
    hf, model = _pair(shape)
    assert_anyres_hooks_and_decoder_edits(model, hf, _cases(shape)["left_padded_batch"])


@pytest.mark.parametrize("case", ["left_padded_batch", "two_images_different_sizes", "text_only",
                                  "mixed_batch_with_text_only_row"])
def test_greedy_generate_matches_hf(case):
    hf, model = _pair("clip_llama_gqa3_g3")
    assert_generate_matches_hf(model, hf, _cases("clip_llama_gqa3_g3")[case])


def test_prompt_format_and_no_hooks_left():
    hf, model = _pair("clip_llama_gqa3_g3")
    inputs = model.prepare(images=[random_image(32, 32, 1)], prompts=["How many dots are there?"])
    tokens = [t for t in model.to_str_tokens(inputs.input_ids[0]) if t != "<image>"]
    assert tokens == ["[", "INST", "]", "How", "many", "dots", "are", "there", "?", "[", "/", "INST", "]"]
    assert model.adapter.fallback_chat_prompt("red ?", 1) == "[INST] <image>\nred ? [/INST]"
    assert_no_hooks_left_after_exception(model, _cases("clip_llama_gqa3_g3")["one_image"],
                                         ["vision.hook_tile_embeds", "vision.hook_image_newline",
                                          "blocks.1.attn.hook_attn_scores", "vision.blocks.0.attn.hook_z"])


def test_bad_inputs_are_clear_errors():
    from vlens.utils.errors import UserInputError

    hf, model = _pair("clip_llama_gqa3_g3")
    kwargs = _cases("clip_llama_gqa3_g3")["one_image"].to_hf_kwargs()
    with pytest.raises(UserInputError, match="image_sizes"):
        model(**{k: v for k, v in kwargs.items() if k != "image_sizes"})
    with pytest.raises(UserInputError, match="pinpoints"):
        model(**{**kwargs, "pixel_values": kwargs["pixel_values"][:, :2]})
    with pytest.raises(UserInputError, match="CLS"):
        model(**kwargs, vision_feature_select_strategy="full")  # CLIP's CLS token cannot tile


def test_saved_checkpoint_loads_with_its_processor(tmp_path):
    hf, model = _pair("siglip_qwen2_layers_g4")
    assert_saved_checkpoint_loads(hf, model.processor, tmp_path, [random_image(40, 40, 1), random_image(64, 32, 2)])


@pytest.mark.parametrize("text_model", ["mistral", "qwen2"])
def test_a_sliding_window_shorter_than_the_prompt_matches_hf(text_model):
    """A Mistral text model (every layer slides) and a Qwen2 one (`use_sliding_window`: the layers from
    `max_window_layers` on) with a window of 12 keys, far shorter than the prompts: logits and greedy
    generation past the window equal HF's."""
    from vlens import HookedVLM
    from vlens.testing import tiny_llava_next_model, tiny_llava_next_processor

    extra = dict(use_sliding_window=True, max_window_layers=1) if text_model == "qwen2" else {}
    hf = tiny_llava_next_model(seed=9, text_model=text_model, sliding_window=12, n_layers=3, tile=16, patch_size=8,
                               pinpoints=[[16, 16], [16, 32]], **extra)
    model = HookedVLM.from_hf(hf, processor=tiny_llava_next_processor(tile=16, patch_size=8,
                                                                      pinpoints=[[16, 16], [16, 32]]))
    sliding = ["sliding_attention"] * 3 if text_model == "mistral" else ["full_attention"] + ["sliding_attention"] * 2
    assert model.cfg.layer_types == sliding and model.cfg.sliding_window == 12
    cases = {"one_image": model.prepare(images=[random_image(30, 20, 1)], prompts=["How many dots are there?"]),
             "left_padded_batch": model.prepare(images=[random_image(30, 20, 1), random_image(20, 33, 2)],
                                                prompts=["How many dots are there?", "red"])}
    assert cases["one_image"].seq_len > 12
    assert_logits_match(model, hf, cases)
    assert_generate_matches_hf(model, hf, cases["left_padded_batch"], max_new_tokens=8)

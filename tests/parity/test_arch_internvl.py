"""InternVL in HookedVLM: the parity matrix against HF eager on tiny shapes unlike the released ones
(tile sides, patch sizes, downsample ratios, InternViT with LayerNorm or RMSNorm and q/k norms, Qwen2 and
Llama decoders), tile regions read back from HF's own forward, the tile layout against the pixels, and
edits on every vision hook."""

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
    # Qwen2 (q/k/v bias), GQA 5:1, 24 px tiles of 6 px patches -> 2x2 tokens per tile, up to 5 tiles
    "qwen2_t24_p6": dict(model=dict(text_model="qwen2", d_model=40, n_heads=5, n_kv_heads=1, tile=24, patch_size=6),
                         processor=dict(tile=24, patch_size=6, max_patches=5)),
    # Llama, head_dim unlike d_model / n_heads, RMSNorm InternViT with q/k norms, the second-to-last layer,
    # 32 px tiles of 4 px patches -> 4x4 tokens
    "llama_rms_qk_layer-2": dict(model=dict(text_model="llama", d_model=48, n_heads=4, n_kv_heads=2, head_dim=10,
                                            tile=32, patch_size=4, norm_type="rms_norm", use_qk_norm=True,
                                            vision_feature_layer=-2, vision_width=32, vision_heads=4,
                                            tie_word_embeddings=False),
                                 processor=dict(tile=32, patch_size=4, max_patches=4)),
    # Qwen2 with the tower's final LayerNorm (use_mean_pooling off) and a 4x4 pixel shuffle (ratio 0.25)
    "qwen2_final_norm_ratio025": dict(model=dict(text_model="qwen2", d_model=36, n_heads=3, n_kv_heads=3, tile=32,
                                                 patch_size=4, downsample_ratio=0.25, use_mean_pooling=False),
                                      processor=dict(tile=32, patch_size=4, downsample_ratio=0.25, max_patches=6)),
}
SIZES = [(40, 70), (90, 30), (33, 47), (64, 64), (50, 20), (28, 96)]  # (width, height): aspect ratios differ


@functools.lru_cache(maxsize=4)
def _pair(shape: str):
    from vlens import HookedVLM
    from vlens.testing import tiny_internvl_model, tiny_internvl_processor

    hf = tiny_internvl_model(seed=len(shape), **SHAPES[shape]["model"])
    return hf, HookedVLM.from_hf(hf, processor=tiny_internvl_processor(**SHAPES[shape]["processor"]))


@functools.lru_cache(maxsize=4)
def _cases(shape: str) -> dict:
    return input_matrix(_pair(shape)[1], SIZES)


@pytest.mark.parametrize("shape", list(SHAPES))
def test_logits_match_hf_eager(shape):
    hf, model = _pair(shape)
    assert model.cfg.architecture == "InternVLForConditionalGeneration" and model.adapter.family == "internvl"
    assert_logits_match(model, hf, _cases(shape))


@pytest.mark.parametrize("shape", list(SHAPES))
def test_regions_follow_hf_features(shape):
    hf, model = _pair(shape)
    for case in ("one_image", "two_images_different_sizes", "left_padded_batch", "mixed_batch_with_text_only_row"):
        assert_regions_follow_hf_features(model, hf, _cases(shape)[case], hf.model.multi_modal_projector)


def test_tile_layout_follows_the_pixels():
    hf, model = _pair("qwen2_t24_p6")
    for width, height in [(90, 30), (30, 80), (70, 50)]:
        assert_layout_follows_pixels(model, width, height, lambda inputs: inputs.pixel_values)


def test_regions_of_a_hand_computed_image():
    """A 90 x 30 image, 24 px tiles, at most 5 tiles: aspect 3 picks the 1 x 3 layout (HF's closest ratio),
    so 3 tiles of 30 x 30 original px and the thumbnail; 2 x 2 tokens each, wrapped in <img> ... </img>."""
    hf, model = _pair("qwen2_t24_p6")
    inputs = model.prepare(images=[random_image(90, 30, 1)], prompts=["red"])
    records = inputs.regions.tiles[0][0]
    assert [(r.kind, r.grid, r.layout, r.layout_grid, r.index) for r in records] == [
        ("tile", (2, 2), (0, 0), (1, 3), 0), ("tile", (2, 2), (0, 1), (1, 3), 1), ("tile", (2, 2), (0, 2), (1, 3), 2),
        ("base", (2, 2), None, None, 3)]
    assert [r.box for r in records] == [(0.0, 0.0, 30.0, 30.0), (30.0, 0.0, 60.0, 30.0), (60.0, 0.0, 90.0, 30.0),
                                        (0.0, 0.0, 90.0, 30.0)]
    first = int(inputs.regions.images[0][0][0])
    assert (records[1].positions - first).tolist() == [4, 5, 6, 7]
    assert inputs.regions.image_view(0).kind == "base" and inputs.regions.image_grid[0] == [(2, 2)]
    assert inputs.pixel_values.shape[0] == 4 and inputs.pixel_entries == [4]
    tokens = model.to_str_tokens(inputs.input_ids[0])
    assert tokens[inputs.regions.marker_positions(0, "start").item()] == "<img>"
    assert tokens[inputs.regions.marker_positions(0, "end").item()] == "</img>"
    assert inputs.regions.marker_positions(0, "end").item() == first + 16
    # a square image: one tile, no thumbnail, one "image" record
    square = model.prepare(images=[random_image(24, 24, 2)], prompts=["red"])
    assert [(r.kind, r.grid) for r in square.regions.tiles[0][0]] == [("image", (2, 2))]


def test_hf_processor_output_without_image_sizes():
    """HF's processor returns no image sizes: the logits are the same, every tile is still found (index,
    grid, thumbnail), but where the tiles lie is unknown, so they are not spatial."""
    hf, model = _pair("qwen2_t24_p6")
    raw = dict(model.processor(text=["<IMG_CONTEXT> red"], images=[random_image(90, 30, 1)], return_tensors="pt"))
    sizes = raw.pop("image_sizes")
    assert sizes.tolist() == [[30, 90]]
    with torch.no_grad():
        torch.testing.assert_close(model(raw), hf(**raw).logits, atol=1e-4, rtol=0)
    records = model.coerce_inputs(raw).regions.tiles[0][0]
    assert [(r.kind, r.index, r.spatial, r.layout) for r in records] == [
        ("tile", 0, False, None), ("tile", 1, False, None), ("tile", 2, False, None), ("base", 3, True, None)]


@pytest.mark.parametrize("shape", ["qwen2_t24_p6", "llama_rms_qk_layer-2"])
def test_vision_hook_edits_equal_hf_edits(shape):
    hf, model = _pair(shape)
    tower = hf.model.vision_tower
    assert_split_image_edits_match_hf(model, hf, _cases(shape)["two_images_different_sizes"], tower.encoder.layer,
                                      lambda layer: layer.attention.projection_layer, hf.model.multi_modal_projector,
                                      block=1)


@pytest.mark.parametrize("shape", list(SHAPES))
def test_decoder_hooks_and_edits(shape):
    hf, model = _pair(shape)
    inputs = _cases(shape)["left_padded_batch"]
    cache = assert_hook_shapes(model, inputs)
    vision = hf.config.vision_config
    n_tiles, width, heads = inputs.pixel_values.shape[0], vision.hidden_size, vision.num_attention_heads
    side = inputs.pixel_values.shape[-1] // vision.patch_size[0]
    for block in range(vision.num_hidden_layers):
        assert cache[f"vision.blocks.{block}.hook_resid_post"].shape == (n_tiles, 1 + side**2, width)
        assert cache[f"vision.blocks.{block}.attn.hook_z"].shape == (n_tiles, 1 + side**2, heads, width // heads)
    g = int(side * hf.config.downsample_ratio)
    assert cache["vision.hook_tile_embeds"].shape == (n_tiles, g * g, model.cfg.d_model)
    assert cache["vision.hook_image_features"].shape[:2] == (n_tiles, g * g)
    assert_head_decomposition(model, inputs)
    assert_hook_z_edit_matches_hf(model, hf, inputs, layer=1, head=1)
    assert_scores_edit_matches_scaling_q(model, hf, inputs, layer=0, head=2)


@pytest.mark.parametrize("case", ["left_padded_batch", "two_images_different_sizes", "text_only",
                                  "mixed_batch_with_text_only_row"])
def test_greedy_generate_matches_hf(case):
    hf, model = _pair("qwen2_t24_p6")
    assert_generate_matches_hf(model, hf, _cases("qwen2_t24_p6")[case])


def test_greedy_generate_with_a_llama_decoder():
    hf, model = _pair("llama_rms_qk_layer-2")
    assert_generate_matches_hf(model, hf, _cases("llama_rms_qk_layer-2")["left_padded_batch"])


def test_prompt_format_and_no_hooks_left():
    hf, model = _pair("qwen2_t24_p6")
    inputs = model.prepare(images=[random_image(24, 24, 1)], prompts=["How many dots are there?"])
    tokens = [t for t in model.to_str_tokens(inputs.input_ids[0]) if t != "<IMG_CONTEXT>"]
    assert tokens == ["<|im_start|>", "user", "<img>", "</img>", "How", "many", "dots", "are", "there", "?",
                      "<|im_end|>", "<|im_start|>", "assistant"]
    assert model.adapter.fallback_chat_prompt("red ?", 1) == \
        "<|im_start|>user\n<IMG_CONTEXT>\nred ?<|im_end|>\n<|im_start|>assistant\n"
    assert_no_hooks_left_after_exception(model, _cases("qwen2_t24_p6")["one_image"],
                                         ["vision.hook_tile_embeds", "vision.hook_image_features",
                                          "blocks.1.attn.hook_attn_scores", "vision.blocks.0.attn.hook_z"])


def test_bad_inputs_are_clear_errors():
    hf, model = _pair("qwen2_t24_p6")
    kwargs = _cases("qwen2_t24_p6")["two_images_different_sizes"].to_hf_kwargs()
    with pytest.raises(UserInputError, match="tiles"):
        model(**{**kwargs, "pixel_values": kwargs["pixel_values"][:-1]})
    with pytest.raises(UserInputError, match="square"):
        model(**{**kwargs, "pixel_values": kwargs["pixel_values"][..., :18]})
    with pytest.raises(UserInputError, match="default"):
        model(**kwargs, vision_feature_select_strategy="full")
    with pytest.raises(UserInputError, match="one vision layer"):
        model(**kwargs, vision_feature_layer=[-1, -2])


def test_saved_checkpoint_loads_with_its_processor(tmp_path):
    hf, model = _pair("llama_rms_qk_layer-2")
    assert_saved_checkpoint_loads(hf, model.processor, tmp_path, [random_image(70, 40, 1), random_image(30, 64, 2)])


def test_image_size_bounds_the_tiles():
    """--image-size N keeps the 24 px tiles and allows (N // 24)^2 of them."""
    from vlens.core.devices import configure_resolution
    from vlens.testing import tiny_internvl_processor

    processor = configure_resolution(tiny_internvl_processor(tile=24, patch_size=6, max_patches=12), image_size=50)
    assert processor.image_processor.max_patches == 4
    out = processor(text=["<IMG_CONTEXT>"], images=[random_image(200, 40, 1)], return_tensors="pt")
    assert out["pixel_values"].shape[0] == 4 + 1  # 1 x 4 tiles and the thumbnail
    with pytest.raises(UserInputError, match="smaller than one tile"):
        configure_resolution(tiny_internvl_processor(tile=24, patch_size=6), image_size=20)


def test_a_qwen3_decoder_with_query_norms_matches_hf():
    """InternVL3.5's text model is Qwen3 (per-head q/k RMSNorm, head_dim from the config)."""
    from vlens import HookedVLM
    from vlens.testing import tiny_internvl_model, tiny_internvl_processor

    hf = tiny_internvl_model(seed=11, text_model="qwen3", head_dim=12, d_model=40, n_heads=5, n_kv_heads=1, tile=24,
                             patch_size=6)
    model = HookedVLM.from_hf(hf, processor=tiny_internvl_processor(tile=24, patch_size=6, max_patches=3))
    assert model.cfg.qk_norm and model.cfg.d_head == 12
    cases = input_matrix(model, SIZES)
    assert_logits_match(model, hf, {k: cases[k] for k in ("two_images_different_sizes", "left_padded_batch")})
    assert_scores_edit_matches_scaling_q(model, hf, cases["left_padded_batch"], layer=1, head=3)
    assert_generate_matches_hf(model, hf, cases["left_padded_batch"])


def test_selecting_rows_of_a_batch_keeps_each_images_tiles():
    """pixel_values concatenates every image's tiles: selecting rows (`PairBatch.select`, as patching does) keeps
    each chosen image's own tiles and image_sizes, so the chosen rows' logits are the batch's."""
    from vlens.patching.pairs import PairBatch

    hf, model = _pair("qwen2_t24_p6")
    batch = model.prepare(images=[random_image(90, 30, 1), random_image(24, 24, 2),
                                  [random_image(30, 80, 3), random_image(50, 50, 4)]], prompts=["red", "blue", "yes"])
    assert batch.pixel_entries == [4, 1, 4, 5]  # 1 x 3 + thumbnail, 1, 3 x 1 + thumbnail, 2 x 2 + thumbnail
    tokens = torch.zeros(3, dtype=torch.long)
    pairs = PairBatch(pair_ids=["a", "b", "c"], clean=batch, corrupt=batch, clean_tokens=tokens, corrupt_tokens=tokens,
                      clean_answers=["1"] * 3, corrupt_answers=["2"] * 3, answer_prefix_len=[0] * 3)
    chosen = pairs.select([2, 0]).clean
    assert chosen.pixel_entries == [4, 5, 4]
    assert chosen.extra["image_sizes"].tolist() == [[80, 30], [50, 50], [30, 90]]
    with torch.no_grad():
        torch.testing.assert_close(model(chosen), model(batch)[[2, 0]], atol=1e-4, rtol=0)
    assert [[r.layout_grid for r in records if r.kind == "tile"] for records in chosen.regions.tiles[0]] == \
        [[(3, 1)] * 3, [(2, 2)] * 4]


def test_focus_prior_lands_on_the_tile_that_holds_the_object():
    """L_focus's prior on a split image: an object in the left third of a 90 x 30 image (1 x 3 tiles) puts its
    tile mass on tile (0, 0), a little on its neighbour (the Gaussian continues), almost none (the Gaussian tail) on the far tile."""
    from vlens.interventions.focus import focus_prior

    hf, model = _pair("qwen2_t24_p6")
    inputs = model.prepare(images=[random_image(90, 30, 1)], prompts=["red"])
    weights = focus_prior(inputs, [[([(10.0, 15.0)], (90, 30))]], model=model).weights[0]
    mass = {r.layout or r.kind: float(weights[r.positions].sum()) for r in inputs.regions.tiles[0][0]}
    assert mass[(0, 0)] > 5 * mass[(0, 1)] and mass[(0, 2)] < 1e-3 and mass["base"] > 0.2
    assert abs(sum(mass.values()) - 1) < 1e-9

"""Llama 4 in HookedVLM: the parity matrix against HF eager on tiny shapes, plus what is its own: chunked attention
(chunks counted from each row's first real token), NoPE layers with attention-temperature tuning, rotary before a
weightless q / k norm, MoE layers (sigmoid top-k router, router-scaled expert inputs, a shared expert) between
dense ones; the vision tower with its pixel-shuffle MLP; tiles + a global tile with their separators as regions
and markers; the torchvision-free processor's layout against HF's arithmetic."""

from __future__ import annotations

import copy
import functools
import warnings

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
from tests.helpers.split_image_parity import (
    assert_regions_follow_hf_features,
    assert_split_image_edits_match_hf,
)
from vlens.testing import random_image

torch.set_num_threads(1)

SHAPES = {
    # 4 layers: three chunked RoPE layers (chunk 5) with the q / k norm, one NoPE layer with temperature tuning
    # (floor scale 3), MoE on layers 1 and 3 (4 experts, top 2), GQA 2:1, d_head 12; 16 px tiles of 4 px patches
    # shuffled 2x2 -> 2x2 tokens per tile, up to 4 tiles
    "chunk5_moe13": dict(model=dict(), processor=dict(tile=16, patch_size=4, max_patches=4)),
    # no q / k norm, every layer MoE with top 1 of 3 experts, NoPE layers 0 and 2, chunk 7, MQA, 24 px tiles of 6 px
    "chunk7_nope02_top1": dict(
        model=dict(n_layers=3, d_model=36, n_heads=3, n_kv_heads=1, d_head=10, d_expert=20, n_experts=3, top_k=1,
                   moe_layers=(0, 1, 2), no_rope_layers=(0, 1, 0), chunk=7, floor_scale=4, attn_scale=0.4, tile=24,
                   patch_size=6, vision_width=24, vision_heads=3, use_qk_norm=False),
        processor=dict(tile=24, patch_size=6, max_patches=3)),
}
SIZES = [(60, 30), (16, 16), (50, 70), (30, 30), (80, 20), (40, 44)]


@functools.lru_cache(maxsize=2)
def _pair(shape: str):
    from vlens import HookedVLM
    from vlens.testing import tiny_llama4_model, tiny_llama4_processor

    hf = tiny_llama4_model(seed=len(shape), **SHAPES[shape]["model"])
    return hf, HookedVLM.from_hf(hf, processor=tiny_llama4_processor(**SHAPES[shape]["processor"]))


@functools.lru_cache(maxsize=2)
def _cases(shape: str) -> dict:
    return input_matrix(_pair(shape)[1], SIZES)


@pytest.mark.parametrize("shape", list(SHAPES))
def test_logits_match_hf_eager(shape):
    hf, model = _pair(shape)
    text = hf.config.text_config
    assert model.adapter.family == "llama4"
    assert model.cfg.nope_layers == [i for i, rope in enumerate(text.no_rope_layers) if not rope]
    assert model.cfg.moe_layers == list(text.moe_layers)
    assert max(inputs.seq_len for inputs in _cases(shape).values()) > 2 * text.attention_chunk_size
    assert_logits_match(model, hf, _cases(shape))


@pytest.mark.parametrize("shape", list(SHAPES))
def test_regions_follow_hf_features(shape):
    hf, model = _pair(shape)
    for case in ("one_image", "two_images_different_sizes", "left_padded_batch", "mixed_batch_with_text_only_row"):
        assert_regions_follow_hf_features(model, hf, _cases(shape)[case], hf.multi_modal_projector)


def test_tile_layout_and_markers():
    """A 50 x 70 image on 16 px tiles (at most 4): a 2 x 2 canvas of 32 px, the image resized to 22 x 32 at its
    top left; tiles row-major with x / y separators, then <|image|> and the global tile."""
    _, model = _pair("chunk5_moe13")
    inputs = _cases("chunk5_moe13")["two_images_different_sizes"]
    tokens = model.tokenizer.convert_ids_to_tokens(inputs.input_ids[0])
    small, tiled = inputs.regions.tiles[0]
    assert [r.kind for r in small] == ["image"]
    assert [(r.kind, r.layout) for r in tiled] == [("tile", (0, 0)), ("tile", (0, 1)), ("tile", (1, 0)),
                                                   ("tile", (1, 1)), ("base", None)]
    torch.testing.assert_close(torch.tensor(tiled[0].box), torch.tensor([0.0, 0.0, 16 * 50 / 22, 35.0]))
    assert tiled[1].extent == (16 * 50 / 22, 0.0, 32 * 50 / 22, 35.0)  # the right column runs onto the padding
    marks = inputs.regions.markers[0][1]
    assert [m.kind for m in marks] == ["start", "tile_x", "tile_y", "tile_x", "tile_y", "global_tag", "end"]
    assert [tokens[int(m.positions)] for m in marks] == [
        "<|image_start|>", "<|tile_x_separator|>", "<|tile_y_separator|>", "<|tile_x_separator|>",
        "<|tile_y_separator|>", "<|image|>", "<|image_end|>"]


def test_processor_layout_is_hfs_arithmetic():
    """The canvas and resize follow HF's `get_best_fit` / `get_max_res_without_distortion` (hand-computed here)."""
    from vlens.core.architectures.llama4_processor import Llama4TileImageProcessor, supported_resolutions

    processor = Llama4TileImageProcessor(size=336, max_patches=4)
    assert sorted(supported_resolutions(4, 336)) == sorted([(336, 1344), (672, 672), (336, 336), (1344, 336),
                                                            (336, 1008), (1008, 336), (336, 672), (672, 336)])
    # 200 x 300 (h, w): the least upscaling is 1.12 (width to 336), reached by 336 x 336 (the least area among the
    # canvases with it); resized without distortion to 224 x 336
    assert processor.layout(200, 300) == ((1, 1), (224, 336))
    # 1000 x 1000: no canvas upscales; the least downscaling, 0.672, is the 2 x 2 canvas
    assert processor.layout(1000, 1000) == ((2, 2), (672, 672))
    # 100 x 900: upscaling by 1.49 (1 x 4) or 1.12 (1 x 3): the smaller, 1 x 3; no resize (width 900 <= 1008,
    # height limited to max(100, 336) = 336 by the canvas, 900 / 900 the binding scale)
    assert processor.layout(100, 900) == ((1, 3), (100, 900))
    out = processor([random_image(900, 100, 1), random_image(40, 40, 2)])
    assert out["pixel_values"].shape == (3 + 1 + 1, 3, 336, 336) and out["aspect_ratios"].tolist() == [[1, 3], [1, 1]]


@pytest.mark.parametrize("case", ["left_padded_batch", "two_images_different_sizes", "mixed_batch_with_text_only_row"])
def test_greedy_generate_matches_hf(case):
    """Through chunk boundaries (the chunked layers' cache keeps every key; the mask chunks) and the NoPE layer's
    per-position temperature while decoding."""
    hf, model = _pair("chunk5_moe13")
    assert_generate_matches_hf(model, hf, _cases("chunk5_moe13")[case], max_new_tokens=7)


def test_hooks_have_transformerlens_shapes_and_heads_add_up():
    _, model = _pair("chunk5_moe13")
    inputs = _cases("chunk5_moe13")["left_padded_batch"]
    cache = assert_hook_shapes(model, inputs)
    n_tiles = inputs.pixel_values.shape[0]
    assert tuple(cache["vision.blocks.1.hook_resid_post"].shape) == (n_tiles, 17, 24)  # 16 patches + CLS (last)
    assert tuple(cache["vision.blocks.1.attn.hook_z"].shape) == (n_tiles, 17, 2, 12)
    assert tuple(cache["vision.hook_image_features"].shape) == (n_tiles, 4, 20)
    assert tuple(cache["vision.hook_tile_embeds"].shape) == (n_tiles, 4, 40)
    b, p = inputs.input_ids.shape
    assert tuple(cache["blocks.1.mlp.hook_router_logits"].shape) == (b, p, 4)
    assert tuple(cache["blocks.1.mlp.hook_expert_out"].shape) == (b, p, 2, 40)
    torch.testing.assert_close(cache["blocks.1.mlp.hook_routed_out"] + cache["blocks.1.mlp.hook_shared_out"],
                               cache["blocks.1.hook_mlp_out"], atol=1e-6, rtol=0)
    assert_head_decomposition(model, inputs)


@pytest.mark.parametrize("shape", list(SHAPES))
def test_head_edits_equal_hf(shape):
    """On a chunked RoPE layer and on a NoPE layer."""
    hf, model = _pair(shape)
    inputs = _cases(shape)["left_padded_batch"]
    for layer in (model.cfg.nope_layers[0], next(x for x in range(model.cfg.n_layers) if x not in model.cfg.nope_layers)):
        assert_hook_z_edit_matches_hf(model, hf, inputs, layer=layer, head=1)


@pytest.mark.parametrize(("shape", "layer"), [("chunk5_moe13", 3), ("chunk7_nope02_top1", 0),
                                            ("chunk7_nope02_top1", 1)])
def test_scores_edit_equals_scaling_q_in_hf(shape, layer):
    """Scaling one head's scores equals scaling its q_proj output in HF: on NoPE layers (the temperature and no
    rotary are linear in q) and on a chunked RoPE layer without the q / k norm (which would undo the scale)."""
    hf, model = _pair(shape)
    assert_scores_edit_matches_scaling_q(model, hf, _cases(shape)["left_padded_batch"], layer=layer, head=1, beta=4.0)


def test_expert_edits_equal_hf():
    """Zeroing expert 2's output (`hook_expert_out` where `hook_expert_indices` is 2) equals HF with that expert's
    router score zeroed (its input, the token times the score, is then zero, and so is its output)."""
    hf, model = _pair("chunk5_moe13")
    inputs = _cases("chunk5_moe13")["one_image"]
    router = hf.language_model.model.layers[1].feed_forward.router
    _, cache = model.run_with_cache(inputs, names_filter="blocks.1.mlp.hook_expert_indices")
    chosen = cache["blocks.1.mlp.hook_expert_indices"] == 2
    assert chosen.any()

    def drop_expert(out, hook):
        return out * ~chosen[..., None].to(out.device)

    def zero_score(module, args, out):
        scores, logits = out
        scores = scores.clone()
        scores[:, 2] = 0
        return scores, logits

    with torch.no_grad():
        ours = model.run_with_hooks(inputs, fwd_hooks=[("blocks.1.mlp.hook_expert_out", drop_expert)])
    torch.testing.assert_close(ours, hf_logits(hf, inputs, forward_hooks=[(router, zero_score)]), atol=1e-4, rtol=0)
    assert (ours - model(inputs)).abs().max() > 1e-5


@pytest.mark.parametrize("shape", list(SHAPES))
def test_vision_hooks_edit_the_tower_and_projector(shape):
    hf, model = _pair(shape)
    assert_split_image_edits_match_hf(model, hf, _cases(shape)["left_padded_batch"], hf.vision_model.model.layers,
                                      lambda layer: layer.self_attn.o_proj, hf.multi_modal_projector)


def test_no_hooks_left_after_exception():
    _, model = _pair("chunk5_moe13")
    assert_no_hooks_left_after_exception(model, _cases("chunk5_moe13")["one_image"],
                                         ["blocks.3.attn.hook_pattern", "blocks.1.mlp.hook_expert_weights",
                                          "vision.blocks.0.hook_resid_post", "vision.blocks.1.attn.hook_z"])


def test_saved_checkpoint_loads_with_its_processor(tmp_path):
    from vlens import HookedVLM
    from vlens.core.architectures.llama4_processor import Llama4ImageTextProcessor

    hf, model = _pair("chunk7_nope02_top1")
    assert_saved_checkpoint_loads(hf, model.processor, tmp_path, [random_image(48, 48, 1), random_image(96, 40, 2)])
    loaded = HookedVLM.from_pretrained(str(tmp_path))
    assert isinstance(loaded.processor, Llama4ImageTextProcessor)
    assert loaded.processor.image_processor.tile == 24 and loaded.processor.patch_size == 6


def test_bf16_is_within_hfs_own_bf16_noise():
    """|ours_bf16 - hf_fp32| <= HF's own bf16 noise |hf_bf16 - hf_fp32| on a padded batch with images, HF's noise
    the larger of its eager and sdpa runs: this tiny model's bf16 logits move ~0.07 between HF's two attention
    paths alone (HF eager 6.6e-3, HF sdpa 7.8e-2; measured), and vlens's fast path is sdpa."""
    from vlens import HookedVLM
    from vlens.testing.llama4 import restore_vision_rotary

    hf, model = _pair("chunk5_moe13")
    with warnings.catch_warnings():  # Module.to casts the complex rotary table to real: restored right after
        warnings.filterwarnings("ignore", message="Casting complex values to real")
        hf16 = copy.deepcopy(hf).to(torch.bfloat16)
    restore_vision_rotary(hf16)
    model16 = HookedVLM.from_hf(hf16, processor=model.processor)
    inputs = input_matrix(model16, SIZES)["left_padded_batch"]
    real = inputs.attention_mask.bool()
    half = {**inputs.to_hf_kwargs(), "pixel_values": inputs.pixel_values.to(torch.bfloat16)}  # HF's processor's dtype
    noise = []
    with torch.no_grad():
        reference = hf(**inputs.to_hf_kwargs()).logits.float()[real]
        for implementation in ("eager", "sdpa"):
            for config in (hf16.config, hf16.language_model.config, hf16.vision_model.config):
                config._attn_implementation = implementation
            noise.append(float((hf16(**half).logits.float()[real] - reference).abs().max()))
        ours = float((model16(inputs).float()[real] - reference).abs().max())
    assert min(noise) > 0 and ours <= max(noise) + 1e-3, (ours, noise)


def test_hf_side_temperature_refuses_the_shared_qk_norm():
    """HF's `qk_norm` (after rotary, one module for q and k) can take no head temperature: refused with the
    reason; without the norm a temperature is HF's q_proj scaled, and equals the HookedVLM's."""
    from vlens.interventions.temperature import HeadTemperature
    from vlens.utils.errors import UserInputError

    hf, _ = _pair("chunk5_moe13")
    temps = HeadTemperature({(0, 1): 2.0, (3, 2): 0.5})
    with pytest.raises(UserInputError, match="shared query norm"):
        temps.export_to_hf(hf)
    hf, model = _pair("chunk7_nope02_top1")
    temps = HeadTemperature({(0, 1): 2.0, (1, 2): 0.5})
    inputs = _cases("chunk7_nope02_top1")["left_padded_batch"]
    handle = temps.export_to_hf(hf)
    try:
        expected = hf_logits(hf, inputs)
    finally:
        handle.remove()
    with temps.applied(model):
        ours = model(inputs)
    torch.testing.assert_close(ours, expected, atol=1e-4, rtol=0)

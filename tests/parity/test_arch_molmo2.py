"""Molmo 2 in HookedVLM: the parity matrix against HF eager on tiny shapes, plus what is its own: image tokens in one
bidirectional block, image features added to the placeholder embeddings, the ViT's selected layers and the pooling
adapter, low-res and high-res views as regions, the image tokens in the embedding's additional vocabulary, the
torchvision-free processor's crops and pooling, Molmo2-O's OLMo decoder refused with the reason."""

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

# GQA 2:1 with d_head != d_model / n_heads and q/k/v biases, 2 x 2 pooling of 4 px patches; MQA without biases, three
# layers whose middle one reads an unscaled rotary table (linear scaling elsewhere), 3 x 3 pooling (windows padded)
SHAPES = {
    "gqa_pool2": dict(),
    "mqa_pool3_two_rope_tables": dict(n_layers=3, d_model=36, n_heads=3, n_kv_heads=1, d_head=10, d_mlp=44,
                                      attention_bias=False, vision_heads=3, vision_width=18, feature_layers=(-2,),
                                      rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 600.0},
                                      rope_scaling_layers=[0, 2]),
}
PROCESSOR = {"gqa_pool2": dict(), "mqa_pool3_two_rope_tables": dict(pooling=(3, 3), margins=(1, 0), max_crops=3)}
IMAGE_SIZES = [(40, 60), (64, 32), (24, 16), (16, 16), (20, 28), (48, 48)]


@functools.lru_cache(maxsize=2)
def _pair(shape: str):
    from vlens import HookedVLM
    from vlens.testing import tiny_molmo2_model, tiny_molmo2_processor

    hf = tiny_molmo2_model(seed=len(shape), **SHAPES[shape])
    return hf, HookedVLM.from_hf(hf, processor=tiny_molmo2_processor(**PROCESSOR[shape]))


@functools.lru_cache(maxsize=2)
def _cases(shape: str) -> dict:
    return input_matrix(_pair(shape)[1], IMAGE_SIZES)


@pytest.mark.parametrize("shape", list(SHAPES))
def test_logits_match_hf_eager(shape):
    hf, model = _pair(shape)
    assert model.cfg.d_vocab_in > model.cfg.d_vocab  # the image tokens live past the LM head's vocabulary
    assert int(_cases(shape)["one_image"].input_ids.max()) >= model.cfg.d_vocab
    assert_logits_match(model, hf, _cases(shape))


def test_two_rotary_tables_are_read_per_layer():
    _, model = _pair("mqa_pool3_two_rope_tables")
    assert model.cfg.rope_layer_types == ["full_attention", "unscaled_attention"]
    assert [model.cfg.rotary_index(layer) for layer in range(3)] == [0, 1, 0]


def test_processor_crops_and_pooling_are_hfs_arithmetic():
    """Hand-computed: a 60 x 40 (h x w) image with 16 px crops, 4 px patches, 1-patch margins (8 px windows) and at
    most 4 crops: every tiling shrinks (60 - 8, 40 - 8) = (52, 32); 2 x 2 windows shrink least
    (min(16 / 52, 16 / 32)), so the canvas is 2 x 8 + 8 = 24 px square (6 x 6 patches, 3 x 3 pooled tokens);
    crops start every 8 px; each canvas patch is pooled once."""
    from vlens.testing import tiny_molmo2_processor

    ip = tiny_molmo2_processor().image_processor
    assert ip.crop_geometry(60, 40) == (2, 2, 24, 24)
    assert ip.grids(60, 40) == ((2, 2), (3, 3), 5)
    patches, pooling, grid = ip.one_image(random_image(40, 60, 1))
    assert patches.shape == (5, 16, 48) and grid == [2, 2, 3, 3]
    assert pooling.shape == (4 + 9, 4)
    # the low-res view's windows: patches (0, 1, 4, 5) of the first crop, then the canvas's patches from crop 1 on
    assert pooling[0].tolist() == [0, 1, 4, 5]
    high = pooling[4:]
    assert sorted(high.flatten().tolist()) == sorted(set(high.flatten().tolist()))  # no canvas patch twice
    # the canvas patch at (row 0, col 2) is crop 0's patch 2 (crop 1, from canvas column 2 on, drops it as its left
    # margin); the patch at (row 0, col 4) is crop 1's column 2 (16 + 2, crop 1 starting at canvas column 2), each
    # counted after the low-res view's 16 patches
    assert int(high[1, 0]) == 16 + 2 and int(high[2, 0]) == 16 + 16 + 2
    # 3 x 3 windows over 4 x 4 patches are padded evenly with -1 (one row / column on each side)
    wide = tiny_molmo2_processor(pooling=(3, 3)).image_processor
    _, pooled, grid = wide.one_image(random_image(16, 16, 2))
    assert grid[:2] == [2, 2] and pooled[0].tolist() == [-1, -1, -1, -1, 0, 1, -1, 4, 5]


def test_processor_text_and_token_types():
    from vlens.testing import tiny_molmo2_processor

    processor = tiny_molmo2_processor()
    out = processor(text=["<|image|>red"], images=[random_image(16, 16, 2)])
    tokens = processor.tokenizer.convert_ids_to_tokens(out["input_ids"][0])
    low = ["<low_res_im_start>", *(["<im_patch>"] * 2 + ["<im_col>"]) * 2, "<im_end>"]
    high = ["<im_start>", *(["<im_patch>"] * 2 + ["<im_col>"]) * 2, "<im_end>"]
    assert tokens == ["<|im_end|>", *low, *high, "red"]  # the EOS stands for the missing BOS, as HF's processor
    assert out["mm_token_type_ids"][0].tolist() == [0] + [1] * (len(low) + len(high)) + [0]
    assert out["image_grids"].tolist() == [[2, 2, 2, 2]] and out["image_num_crops"].tolist() == [2]


def test_views_regions_markers_and_block():
    """Each image: its low-res grid, then its high-res grid (the image's view); start / <im_col> / end are markers;
    every image token of a row (markers included) is in the one bidirectional block."""
    _, model = _pair("gqa_pool2")
    inputs = _cases("gqa_pool2")["two_images_different_sizes"]
    tokens = model.tokenizer.convert_ids_to_tokens(inputs.input_ids[0])
    ip = model.processor.image_processor
    # 64 x 32: 1 x 3 windows (a 16 x 32 px canvas: 2 x 4 tokens) + the low-res view
    assert ip.grids(32, 64) == ((2, 2), (2, 4), 4)
    assert inputs.pixel_entries == [4, ip.grids(16, 24)[2]]
    assert inputs.regions.image_grid == [[(2, 4), ip.grids(16, 24)[1]]]
    for records, marks in zip(inputs.regions.tiles[0], inputs.regions.markers[0], strict=True):
        assert [r.kind for r in records] == ["low_res", "image"]
        assert all(tokens[int(p)] == "<im_patch>" for r in records for p in r.positions)
        kinds = [(m.kind, tokens[int(m.positions)]) for m in marks]
        assert kinds[0] == ("start", "<low_res_im_start>") and kinds[-1] == ("end", "<im_end>")
        assert ("start", "<im_start>") in kinds and all(t == "<im_col>" for k, t in kinds if k == "newline")
        assert len(kinds) == 4 + records[0].grid[0] + records[1].grid[0]
    blocks = model.adapter.attention_blocks(model.cfg, inputs)
    assert blocks is not None and set(blocks[0].tolist()) == {-1, 0}
    assert bool((blocks[0] == 0).eq(inputs.mm_token_type_ids[0] == 1).all())


def test_object_points_map_through_each_view():
    """A 60 x 40 px image's high-res grid covers the 24 px canvas (the image squashed), its low-res grid the 16 px
    crop; with 3 x 3 windows over 4 x 4 patches, one padded patch row / column shifts the cells."""
    from vlens.core.architectures.base import ImageTile
    from vlens.testing import tiny_molmo2_processor

    _, model = _pair("gqa_pool2")
    points = torch.tensor([[0.0, 0.0], [20.0, 30.0]], dtype=torch.float64)
    grid, _ = model.adapter.image_points_to_grid(model.processor, points, (40, 60), (3, 3))
    torch.testing.assert_close(grid, torch.tensor([[-0.5, -0.5], [1.0, 1.0]], dtype=torch.float64))
    low = ImageTile("low_res", torch.arange(4), (2, 2))
    grid, _ = model.adapter.image_points_to_tile(model.processor, points, (40, 60), low)
    torch.testing.assert_close(grid, torch.tensor([[-0.5, -0.5], [0.5, 0.5]], dtype=torch.float64))
    # 3 x 3 windows over the low-res view's 4 x 4 patches: one padding patch first, y = 30 px -> patch 2 + 1
    grid, _ = model.adapter.image_points_to_tile(tiny_molmo2_processor(pooling=(3, 3)), points, (40, 60), low)
    torch.testing.assert_close(grid, torch.tensor([[-1 / 6, -1 / 6], [0.5, 0.5]], dtype=torch.float64))


def test_selecting_rows_keeps_each_images_crops_and_pooling():
    hf, model = _pair("gqa_pool2")
    batch = model.prepare(images=[random_image(16, 16, 4), random_image(40, 60, 1)], prompts=["red", "blue ?"])
    row = batch.select_rows([1])
    assert row.pixel_entries == [5] and row.pixel_values.shape[0] == 5
    assert row.extra["image_grids"].tolist() == [[2, 2, 3, 3]] and row.extra["image_token_pooling"].shape[0] == 13
    with torch.no_grad():
        torch.testing.assert_close(model(row), hf(**row.to_hf_kwargs()).logits, atol=1e-4, rtol=0)


@pytest.mark.parametrize("case", ["left_padded_batch", "two_images_different_sizes", "mixed_batch_with_text_only_row"])
def test_greedy_generate_matches_hf(case):
    hf, model = _pair("mqa_pool3_two_rope_tables")
    assert_generate_matches_hf(model, hf, _cases("mqa_pool3_two_rope_tables")[case], max_new_tokens=6)


def test_hooks_have_transformerlens_shapes_and_heads_add_up():
    _, model = _pair("gqa_pool2")
    inputs = _cases("gqa_pool2")["left_padded_batch"]
    cache = assert_hook_shapes(model, inputs)
    n_crops = inputs.pixel_values.shape[0]
    assert tuple(cache["vision.blocks.2.hook_resid_post"].shape) == (n_crops, 16, 24)
    assert tuple(cache["vision.blocks.2.attn.hook_z"].shape) == (n_crops, 16, 2, 12)
    assert tuple(cache["vision.hook_image_features"].shape) == (n_crops, 16, 48)  # two layers concatenated
    assert_head_decomposition(model, inputs)


@pytest.mark.parametrize("shape", list(SHAPES))
def test_head_edits_equal_hf(shape):
    hf, model = _pair(shape)
    inputs = _cases(shape)["left_padded_batch"]
    assert_hook_z_edit_matches_hf(model, hf, inputs, layer=1, head=1)
    assert_scores_edit_matches_scaling_q(model, hf, inputs, layer=0, head=2)


@pytest.mark.parametrize("shape", list(SHAPES))
def test_vision_hooks_edit_the_tower_and_adapter(shape):
    """A ViT block's output, one ViT head, the adapter's input (the selected layers) and its output: each edit
    equals HF with the same edit; zeroed features leave the <im_patch> embeddings, as HF's addition does."""
    hf, model = _pair(shape)
    inputs = _cases(shape)["left_padded_batch"]
    tower, adapter = hf.model.vision_tower, hf.model.multi_modal_projector
    plain = model(inputs)

    def check(name, fn, expected, moves=1e-4):
        with torch.no_grad():
            ours = model.run_with_hooks(inputs, fwd_hooks=[(name, fn)])
        torch.testing.assert_close(ours, expected, atol=1e-4, rtol=0)
        assert (ours - plain).abs().max() > moves, name

    # HF records the layers the adapter reads with its own forward hooks: the edit goes in front of them
    handle = tower.layers[0].register_forward_hook(lambda m, a, out: out.roll(1, -1), prepend=True)
    try:
        expected = hf_logits(hf, inputs)
    finally:
        handle.remove()
    check("vision.blocks.0.hook_resid_post", lambda x, hook: x.roll(1, -1), expected)
    width = tower.config.hidden_size // tower.config.num_attention_heads

    def drop_head(z, hook):
        z = z.clone()
        z[..., 1, :] = 0
        return z

    def drop_head_hf(module, args):
        x = args[0].clone()
        x[..., width:2 * width] = 0
        return (x,)

    check("vision.blocks.0.attn.hook_z", drop_head,
          hf_logits(hf, inputs, pre_hooks=[(tower.layers[0].self_attn.o_proj, drop_head_hf)]), moves=1e-5)
    check("vision.hook_image_features", lambda x, hook: x * 1.5,
          hf_logits(hf, inputs, pre_hooks=[(adapter, lambda m, args: (args[0] * 1.5, *args[1:]))]))
    check("vision.hook_image_embeds", lambda x, hook: x * 0,
          hf_logits(hf, inputs, forward_hooks=[(adapter.image_projector, lambda m, a, out: out * 0)]))


def test_no_hooks_left_after_exception():
    _, model = _pair("gqa_pool2")
    assert_no_hooks_left_after_exception(model, _cases("gqa_pool2")["one_image"],
                                         ["blocks.1.attn.hook_pattern", "vision.blocks.0.hook_resid_post",
                                          "vision.blocks.1.attn.hook_z", "vision.hook_image_features"])


def test_saved_checkpoint_loads_with_its_processor(tmp_path):
    """The folder's processor is rebuilt without torchvision (HF's Molmo 2 processors need it)."""
    from vlens import HookedVLM
    from vlens.core.architectures.molmo2_processor import Molmo2ImageTextProcessor

    hf, model = _pair("mqa_pool3_two_rope_tables")
    assert_saved_checkpoint_loads(hf, model.processor, tmp_path, [random_image(40, 60, 1), random_image(16, 16, 2)])
    loaded = HookedVLM.from_pretrained(str(tmp_path))
    assert isinstance(loaded.processor, Molmo2ImageTextProcessor)
    assert loaded.processor.image_processor.pooling_size == (3, 3)


def test_bf16_is_within_hfs_own_bf16_noise():
    hf, model = _pair("gqa_pool2")
    assert_bf16_within_hf_noise(hf, model.processor, lambda m: input_matrix(m, IMAGE_SIZES)["left_padded_batch"],
                                slack=1.0)


@pytest.mark.parametrize("change,reason", [(dict(qk_norm_type="olmo"), "over all heads together"),
                                           (dict(norm_after=True), "norm_after")])
def test_olmo_decoders_are_refused_with_the_reason(change, reason):
    from vlens import HookedVLM
    from vlens.testing import tiny_molmo2_model
    from vlens.utils.errors import UserInputError

    with pytest.raises(UserInputError, match=reason):
        HookedVLM.from_hf(tiny_molmo2_model(**change))

"""Mistral 3 in HookedVLM: the parity matrix against HF eager on tiny shapes, plus what is its own: Pixtral's tower
(images of different sizes in one sequence, 2-D rotary, block-diagonal mask), the patch merger, the `[IMG_BREAK]` /
`[IMG_END]` layout as regions and markers, the torchvision-free processor, Ministral 3 refused with its reason."""

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
    assert_vision_head_and_projector_edits_match_hf,
    hf_logits,
    input_matrix,
)
from vlens.testing import random_image

torch.set_num_threads(1)

# MQA with d_head != d_model / n_heads and a 2x2 merge of 4 px patches; GQA with a sliding window shorter than the
# prompt, no merge (1), the second-to-last vision layer's features, projector biases, 6 px patches (HF's projector
# norm takes one layer's width, so a list of feature layers fails in HF itself)
SHAPES = {
    "mqa_merge2": dict(),
    "gqa2_window5_merge1_two_layers": dict(
        n_layers=3, d_model=36, n_heads=4, n_kv_heads=2, d_head=10, d_mlp=44, sliding_window=5, patch_size=6,
        merge=1, vision_heads=3, vision_width=18, vision_depth=3, vision_feature_layer=-2,
        multimodal_projector_bias=True),
}
PROCESSOR = {"mqa_merge2": dict(longest_edge=48, patch_size=4, merge=2),
             "gqa2_window5_merge1_two_layers": dict(longest_edge=30, patch_size=6, merge=1)}
IMAGE_SIZES = [(40, 60), (96, 64), (32, 48), (64, 64), (50, 50), (64, 96)]


@functools.lru_cache(maxsize=2)
def _pair(shape: str):
    from vlens import HookedVLM
    from vlens.testing import tiny_mistral3_model, tiny_mistral3_processor

    hf = tiny_mistral3_model(seed=len(shape), **SHAPES[shape])
    return hf, HookedVLM.from_hf(hf, processor=tiny_mistral3_processor(**PROCESSOR[shape]))


@functools.lru_cache(maxsize=2)
def _cases(shape: str) -> dict:
    return input_matrix(_pair(shape)[1], IMAGE_SIZES)


@pytest.mark.parametrize("shape", list(SHAPES))
def test_logits_match_hf_eager(shape):
    hf, model = _pair(shape)
    assert model.cfg.d_head == SHAPES[shape].get("d_head", 12)
    assert model.cfg.sliding_window == SHAPES[shape].get("sliding_window")
    assert_logits_match(model, hf, _cases(shape))


def test_image_layout_regions_and_markers():
    """Each image: rows x cols `[IMG]` on its merged grid, row-major, each row closed by `[IMG_BREAK]`, the last
    by `[IMG_END]`; regions hold the placeholders, markers the closing tokens; image_sizes as HF's resize."""
    _, model = _pair("mqa_merge2")
    inputs = _cases("mqa_merge2")["two_images_different_sizes"]
    tokens = model.tokenizer.convert_ids_to_tokens(inputs.input_ids[0])
    sizes = inputs.extra["image_sizes"].tolist()
    assert sizes == [[32, 48], [48, 32]]  # (height, width): 96 x 64 and 32 x 48 within 48 px, multiples of 8
    assert inputs.regions.image_grid[0] == [(4, 6), (6, 4)]
    for image, (rows, cols), marks in zip(inputs.regions.images[0], inputs.regions.image_grid[0],
                                          inputs.regions.markers[0], strict=True):
        assert len(image) == rows * cols and all(tokens[int(p)] == "[IMG]" for p in image)
        assert [m.kind for m in marks] == ["break"] * (rows - 1) + ["end"]
        assert [tokens[int(m.positions)] for m in marks] == ["[IMG_BREAK]"] * (rows - 1) + ["[IMG_END]"]
        for r in range(rows):  # row r's placeholders come right before its closing token
            assert image[r * cols:(r + 1) * cols].tolist() == list(range(int(marks[r].positions) - cols,
                                                                         int(marks[r].positions)))


@pytest.mark.parametrize("case", ["left_padded_batch", "two_images_different_sizes", "mixed_batch_with_text_only_row"])
def test_greedy_generate_matches_hf(case):
    hf, model = _pair("gqa2_window5_merge1_two_layers")
    inputs = _cases("gqa2_window5_merge1_two_layers")[case]
    assert inputs.seq_len > model.cfg.sliding_window
    assert_generate_matches_hf(model, hf, inputs, max_new_tokens=6)


def test_hooks_have_transformerlens_shapes_and_heads_add_up():
    _, model = _pair("mqa_merge2")
    inputs = _cases("mqa_merge2")["left_padded_batch"]
    cache = assert_hook_shapes(model, inputs)
    n_patches = sum((h // 4) * (w // 4) for h, w in inputs.extra["image_sizes"].tolist())
    assert tuple(cache["vision.blocks.1.hook_resid_post"].shape) == (1, n_patches, 24)
    assert tuple(cache["vision.blocks.1.attn.hook_z"].shape) == (1, n_patches, 2, 12)
    assert tuple(cache["vision.hook_image_features"].shape) == (n_patches, 24)
    assert_head_decomposition(model, inputs)


@pytest.mark.parametrize("shape", list(SHAPES))
def test_head_edits_equal_hf(shape):
    hf, model = _pair(shape)
    inputs = _cases(shape)["left_padded_batch"]
    assert_hook_z_edit_matches_hf(model, hf, inputs, layer=1, head=1)
    assert_scores_edit_matches_scaling_q(model, hf, inputs, layer=0, head=2)


@pytest.mark.parametrize("shape", list(SHAPES))
def test_vision_hooks_edit_the_tower_and_projector(shape):
    """Vision block outputs, heads, the projector's input and output: each edit equals HF with the same edit
    (the selected layers are read from our block-by-block run, so a block edit reaches them)."""
    hf, model = _pair(shape)
    inputs = _cases(shape)["left_padded_batch"]
    layers = hf.model.vision_tower.transformer.layers
    ours = model.run_with_hooks(inputs, fwd_hooks=[("vision.blocks.0.hook_resid_post", lambda x, hook: x.roll(1, -1))])
    expected = hf_logits(hf, inputs, forward_hooks=[(layers[0], lambda m, a, out: out.roll(1, -1))])
    torch.testing.assert_close(ours, expected, atol=1e-4, rtol=0)
    assert (ours - model(inputs)).abs().max() > 1e-4
    assert_vision_head_and_projector_edits_match_hf(model, hf, inputs, _attention_layers(layers),
                                                    hf.model.multi_modal_projector,
                                                    hf.config.vision_config.num_attention_heads)


class _AttentionView:
    """A Pixtral layer seen as the shared check expects (`self_attn.out_proj`)."""

    def __init__(self, layer):
        self.self_attn = type("attn", (), {"out_proj": layer.attention.o_proj})()


def _attention_layers(layers):
    return [_AttentionView(layer) for layer in layers]


def test_no_hooks_left_after_exception():
    _, model = _pair("mqa_merge2")
    assert_no_hooks_left_after_exception(model, _cases("mqa_merge2")["one_image"],
                                         ["blocks.1.attn.hook_pattern", "vision.blocks.0.hook_resid_post",
                                          "vision.blocks.1.attn.hook_z", "vision.hook_image_features"])


def test_saved_checkpoint_loads_with_its_processor(tmp_path):
    """The folder's processor is rebuilt without torchvision (HF's PixtralProcessor needs it)."""
    from vlens import HookedVLM
    from vlens.core.architectures.mistral3 import PixtralImageTextProcessor

    hf, model = _pair("gqa2_window5_merge1_two_layers")
    assert_saved_checkpoint_loads(hf, model.processor, tmp_path, [random_image(48, 48, 1), random_image(96, 64, 2)])
    loaded = HookedVLM.from_pretrained(str(tmp_path))
    assert isinstance(loaded.processor, PixtralImageTextProcessor)
    assert (loaded.processor.patch_size, loaded.processor.spatial_merge_size) == (6, 1)


def test_bf16_is_within_hfs_own_bf16_noise():
    hf, model = _pair("mqa_merge2")
    assert_bf16_within_hf_noise(hf, model.processor, lambda m: input_matrix(m, IMAGE_SIZES)["left_padded_batch"],
                                slack=1.0)


def test_ministral3_is_refused_with_the_reason():
    from vlens import HookedVLM
    from vlens.testing import tiny_mistral3_model
    from vlens.utils.errors import UserInputError

    with pytest.raises(UserInputError, match="scales its queries by position"):
        HookedVLM.from_hf(tiny_mistral3_model(model_type="ministral3", rope_parameters={
            "rope_type": "default", "rope_theta": 700.0, "llama_4_scaling_beta": 0.1,
            "original_max_position_embeddings": 64}))


def test_object_points_map_through_the_whole_image_resize():
    _, model = _pair("mqa_merge2")
    points = torch.tensor([[0.0, 0.0], [48.0, 32.0], [96.0, 64.0]], dtype=torch.float64)
    grid, visible = model.adapter.image_points_to_grid(model.processor, points, (96, 64), (4, 6))
    torch.testing.assert_close(grid, torch.tensor([[-0.5, -0.5], [1.5, 2.5], [3.5, 5.5]], dtype=torch.float64))
    assert visible.all()


def test_image_size_bounds_the_longest_edge():
    """--image-size sets Pixtral's longest edge (aspect kept, sides multiples of patch x merge); no pixel budget."""
    from vlens import HookedVLM
    from vlens.core.devices import configure_resolution
    from vlens.testing import tiny_mistral3_processor
    from vlens.utils.errors import UserInputError

    hf, _ = _pair("mqa_merge2")
    processor = configure_resolution(tiny_mistral3_processor(**PROCESSOR["mqa_merge2"]), image_size=24)
    model = HookedVLM.from_hf(hf, processor=processor)
    inputs = model.prepare(images=[random_image(96, 64, 1)], prompts=["red"])
    assert inputs.extra["image_sizes"].tolist() == [[16, 24]] and inputs.regions.image_grid == [[(2, 3)]]
    with torch.no_grad():
        torch.testing.assert_close(model(inputs), hf(**inputs.to_hf_kwargs()).logits, atol=1e-4, rtol=0)
    with pytest.raises(UserInputError, match="pixel budget"):
        configure_resolution(tiny_mistral3_processor(), min_pixels=1024)

"""PaliGemma in HookedVLM: the parity matrix against HF eager on tiny shapes, plus what is PaliGemma's own: the
prompt as one bidirectional prefix block (token types), 1-based positions, the SigLIP tower and linear
projector, prompts without images (which HF's processor refuses), and PaliGemma 2 refused with its reason."""

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

# GQA / MQA / MHA, head sizes unlike d_model / n_heads, biases, patch grids of 4x4 and 3x3 (28 / 7, 36 / 12)
SHAPES = {
    "mqa_d12_4x4": dict(),
    "gqa2_bias_3x3": dict(n_layers=3, d_model=36, n_heads=4, n_kv_heads=2, d_head=10, d_mlp=50, attention_bias=True,
                          image_size=36, patch_size=12, vision_heads=2, vision_width=20, vision_depth=3),
}
IMAGE_SIZES = [(40, 60), (96, 64), (32, 48), (64, 64), (50, 50), (64, 96)]


def _processor(shape: str):
    from vlens.testing import tiny_paligemma_processor

    kw = SHAPES[shape]
    return tiny_paligemma_processor(image_size=kw.get("image_size", 28), patch_size=kw.get("patch_size", 7))


@functools.lru_cache(maxsize=2)
def _pair(shape: str):
    from vlens import HookedVLM
    from vlens.testing import tiny_paligemma_model

    hf = tiny_paligemma_model(seed=len(shape), **SHAPES[shape])
    return hf, HookedVLM.from_hf(hf, processor=_processor(shape))


@functools.lru_cache(maxsize=2)
def _cases(shape: str) -> dict:
    return input_matrix(_pair(shape)[1], IMAGE_SIZES)


@pytest.mark.parametrize("shape", list(SHAPES))
def test_logits_match_hf_eager(shape):
    hf, model = _pair(shape)
    assert model.cfg.d_head == SHAPES[shape].get("d_head", 12) and not model.cfg.qk_norm
    assert_logits_match(model, hf, _cases(shape))


def test_processor_output_as_a_user_passes_it():
    """HF's processor output (prompts with images, token types, the processor's labels) runs as it is."""
    hf, model = _pair("mqa_d12_4x4")
    processor = model.processor
    side, processor.tokenizer.padding_side = processor.tokenizer.padding_side, "left"
    try:
        out = processor(text=["<image>How many dots are there?", "<image><image>red"], return_tensors="pt",
                        images=[[random_image(70, 40, 1)], [random_image(30, 50, 2), random_image(64, 64, 3)]],
                        padding=True)
    finally:
        processor.tokenizer.padding_side = side
    with torch.no_grad():
        torch.testing.assert_close(model(out), hf(**out).logits, atol=1e-4, rtol=0)
    prepared = model.prepare(images=[[random_image(70, 40, 1)], [random_image(30, 50, 2), random_image(64, 64, 3)]],
                             prompts=["How many dots are there?", "red"])
    assert torch.equal(prepared.input_ids, out["input_ids"])  # prepare formats as the processor does
    assert torch.equal(prepared.extra["token_type_ids"], out["token_type_ids"])
    regions = model.coerce_inputs(out).regions
    placeholders = out["input_ids"] == hf.config.image_token_id
    for row in range(2):
        assert regions.image[row].tolist() == placeholders[row].nonzero().flatten().tolist()
    assert [len(images) for images in regions.images] == [1, 2] and regions.image_grid[0] == [(4, 4)]


def test_the_prompt_is_one_bidirectional_prefix_and_the_suffix_is_causal():
    """Every prefix token (images, <bos>, prompt, newline) reads every other one; suffix tokens (type 1) read
    causally; both as in HF (logits), and appended tokens are suffix tokens."""
    from vlens.core.answers import teacher_force

    hf, model = _pair("mqa_d12_4x4")
    inputs = _cases("mqa_d12_4x4")["left_padded_batch"]
    _, cache = model.run_with_cache(inputs, names_filter=lambda n: n.endswith("hook_pattern"))
    pattern = cache["blocks.0.attn.hook_pattern"]  # [batch, heads, q, k]
    mask = inputs.attention_mask.bool()
    for row in range(2):
        real = mask[row].nonzero().flatten()
        first, last = int(real[0]), int(real[-1])
        assert bool((pattern[row, :, first, first:last + 1] > 0).all())  # the first token reads the last
        assert float(pattern[row][:, real][:, :, ~mask[row]].abs().sum()) == 0.0  # never a padding key
    assert not bool(mask[1].all())  # the second row is padded
    three = model.to_single_token("3")
    forced = teacher_force(model, inputs, [[three, three, three], [three, three, three]])
    types = forced.extra["token_type_ids"]
    assert types.shape == forced.input_ids.shape and types[:, inputs.seq_len:].eq(1).all()
    with torch.no_grad():
        torch.testing.assert_close(model(forced), hf(**forced.to_hf_kwargs()).logits, atol=1e-4, rtol=0)
    _, cache = model.run_with_cache(forced, names_filter="blocks.1.attn.hook_pattern")
    pattern = cache["blocks.1.attn.hook_pattern"]
    n = inputs.seq_len
    assert float(pattern[:, :, : n, n:].abs().max()) == 0.0  # the prefix never reads the suffix
    assert float(pattern[:, :, n, n + 1:].abs().max()) == 0.0  # a suffix token reads causally
    # without token types: the processor's rule (the prompt is the prefix)
    bare = {k: v for k, v in inputs.to_hf_kwargs().items() if k != "token_type_ids"}
    with torch.no_grad():
        torch.testing.assert_close(model(**bare), hf(**inputs.to_hf_kwargs()).logits, atol=1e-4, rtol=0)


def test_positions_are_one_based_and_hf_generates_the_same():
    _, model = _pair("mqa_d12_4x4")
    inputs = _cases("mqa_d12_4x4")["left_padded_batch"]
    positions, _ = model.adapter.position_ids(model.hf_model, inputs)
    mask = inputs.attention_mask.bool()
    for row in range(2):
        n_pad = int((~mask[row]).sum())
        assert positions[row].tolist() == list(range(1 - n_pad, inputs.seq_len + 1 - n_pad))
    assert not bool(mask.all())  # a padded row: padding counts back from its first real token


@pytest.mark.parametrize("case", ["left_padded_batch", "two_images_different_sizes", "mixed_batch_with_text_only_row",
                                  "text_only_padded_batch"])
def test_greedy_generate_matches_hf(case):
    hf, model = _pair("gqa2_bias_3x3")
    assert_generate_matches_hf(model, hf, _cases("gqa2_bias_3x3")[case], max_new_tokens=6)


def test_hooks_have_transformerlens_shapes_and_heads_add_up():
    _, model = _pair("gqa2_bias_3x3")
    inputs = _cases("gqa2_bias_3x3")["left_padded_batch"]
    cache = assert_hook_shapes(model, inputs)
    assert tuple(cache["vision.blocks.2.hook_resid_post"].shape) == (2, 9, 20)
    assert tuple(cache["vision.blocks.2.attn.hook_z"].shape) == (2, 9, 2, 10)
    assert tuple(cache["vision.hook_image_features"].shape) == (2, 9, 20)
    assert_head_decomposition(model, inputs)


@pytest.mark.parametrize("shape", list(SHAPES))
def test_head_edits_equal_hf(shape):
    hf, model = _pair(shape)
    inputs = _cases(shape)["left_padded_batch"]
    assert_hook_z_edit_matches_hf(model, hf, inputs, layer=1, head=1)
    assert_scores_edit_matches_scaling_q(model, hf, inputs, layer=0, head=2)


def test_vision_hooks_edit_the_tower_and_projector():
    hf, model = _pair("mqa_d12_4x4")
    inputs = _cases("mqa_d12_4x4")["left_padded_batch"]
    tower = hf.model.vision_tower
    ours = model.run_with_hooks(inputs, fwd_hooks=[("vision.blocks.0.hook_resid_post", lambda x, hook: x * 0.5)])
    expected = hf_logits(hf, inputs, forward_hooks=[(tower.encoder.layers[0], lambda m, a, out: out * 0.5)])
    torch.testing.assert_close(ours, expected, atol=1e-4, rtol=0)
    assert (ours - model(inputs)).abs().max() > 1e-4
    assert_vision_head_and_projector_edits_match_hf(model, hf, inputs, tower.encoder.layers,
                                                    hf.model.multi_modal_projector,
                                                    hf.config.vision_config.num_attention_heads)


def test_no_hooks_left_after_exception():
    _, model = _pair("mqa_d12_4x4")
    assert_no_hooks_left_after_exception(model, _cases("mqa_d12_4x4")["one_image"],
                                         ["blocks.1.attn.hook_pattern", "blocks.0.ln1.hook_scale",
                                          "vision.blocks.0.attn.hook_z", "vision.hook_image_features"])


def test_saved_checkpoint_loads_with_its_processor(tmp_path):
    hf, model = _pair("mqa_d12_4x4")
    assert_saved_checkpoint_loads(hf, model.processor, tmp_path, [random_image(48, 48, 1), random_image(96, 64, 2)])


def test_bf16_is_within_hfs_own_bf16_noise():
    """|ours_bf16 - hf_fp32| is no larger than |hf_bf16 - hf_fp32| (+ 1e-3) on a padded two-image batch."""
    hf, model = _pair("gqa2_bias_3x3")
    assert_bf16_within_hf_noise(hf, model.processor, lambda m: input_matrix(m, IMAGE_SIZES)["left_padded_batch"],
                                slack=1.0)


def test_paligemma2_is_refused_with_the_reason():
    from vlens import HookedVLM
    from vlens.testing import tiny_paligemma_model
    from vlens.utils.errors import UserInputError

    with pytest.raises(UserInputError, match="soft-cap"):
        HookedVLM.from_hf(tiny_paligemma_model(gemma2=True))


def test_wrong_image_size_and_placeholder_count_are_clear_errors():
    from vlens.utils.errors import UserInputError

    _, model = _pair("mqa_d12_4x4")
    inputs = _cases("mqa_d12_4x4")["one_image"]
    with pytest.raises(UserInputError, match="28, 28"):
        model(input_ids=inputs.input_ids, pixel_values=torch.zeros(1, 3, 32, 32))
    with pytest.raises(UserInputError, match="placeholders for 1 images"):
        model.prepare(images=[random_image(40, 40, 1)], prompts=["<image><image>red"], chat=False)


def test_a_fine_tuning_batch_is_hfs_prefix_and_suffix():
    """`collate` gives what HF's processor gives with ``suffix=``: the answer and <eos> after the prompt's newline,
    as suffix tokens (causal, unseen by the prompt); the loss's logits equal HF's."""
    from vlens.training.data import SFTExample, collate

    hf, model = _pair("mqa_d12_4x4")
    image = random_image(50, 40, 4)
    batch = collate(model, [SFTExample(images=[image], question="How many dots are there?", answer="3")],
                    with_prior=False)
    expected = model.processor(text=["<image>How many dots are there?"], images=[image], suffix=["3"],
                               return_tensors="pt")
    assert torch.equal(batch.inputs.input_ids, expected["input_ids"])
    assert torch.equal(batch.inputs.extra["token_type_ids"], expected["token_type_ids"])
    assert batch.inputs.extra["token_type_ids"][0, -2:].tolist() == [1, 1]
    with torch.no_grad():
        torch.testing.assert_close(model(batch.inputs), hf(**batch.inputs.to_hf_kwargs()).logits, atol=1e-4, rtol=0)

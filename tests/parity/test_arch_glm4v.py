"""GLM-4.1V in HookedVLM: the parity matrix against HF eager on tiny shapes unlike the released ones (rotary
fractions, M-RoPE sections, GQA ratios, patch and merge sizes), the four-norm block, the fused MLP, adjacent-pair
rotary, regions against HF's own 3-D positions, bf16 within HF's own bf16 noise, and edits on the vision hooks."""

from __future__ import annotations

import functools

import pytest
import torch

from tests.helpers.arch_parity import (
    assert_bf16_within_hf_noise,
    assert_generate_matches_hf,
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
from vlens.utils.errors import UserInputError

SHAPES = {
    # half the head rotated (sections 2/1/1 pairs), GQA 2:1, 6 px patches merged 2 x 2
    "half_rotary_gqa2": dict(model=dict(d_model=64, n_heads=4, n_kv_heads=2, d_mlp=72),
                             processor=dict(patch_size=6, merge_size=2, min_pixels=24 * 24, max_pixels=60 * 60)),
    # the whole head rotated (sections 4/2/2), one kv head for three, 7 px patches, 2 vision heads, 3 layers
    "full_rotary_mqa": dict(model=dict(d_model=48, n_heads=3, n_kv_heads=1, d_mlp=40, n_layers=3,
                                       partial_rotary_factor=1.0, mrope_section=[4, 2, 2], patch_size=7,
                                       vision_width=16, vision_heads=2, vision_image_size=28),
                            processor=dict(patch_size=7, merge_size=2, min_pixels=28 * 28, max_pixels=70 * 70)),
}
SIZES = [(40, 70), (90, 30), (33, 47), (64, 64), (50, 20), (28, 96)]


@functools.lru_cache(maxsize=2)
def _pair(shape: str):
    from vlens import HookedVLM
    from vlens.testing import tiny_glm4v_model, tiny_glm4v_processor

    spec = SHAPES[shape]
    hf = tiny_glm4v_model(seed=len(shape), **spec["model"])
    return hf, HookedVLM.from_hf(hf, processor=tiny_glm4v_processor(**spec["processor"]))


@functools.lru_cache(maxsize=2)
def _cases(shape: str) -> dict:
    return input_matrix(_pair(shape)[1], SIZES)


@pytest.mark.parametrize("shape", list(SHAPES))
def test_logits_match_hf_eager(shape):
    hf, model = _pair(shape)
    assert model.adapter.family == "glm4v" and model.cfg.rope_adjacent_pairs
    assert model.cfg.d_head == model.cfg.d_model // model.cfg.n_heads
    assert_logits_match(model, hf, _cases(shape))


def test_adjacent_pair_rotation_is_what_hf_does():
    """Rotating halves (Llama's pairs) instead of adjacent pairs changes the logits: the flag is load-bearing."""
    hf, model = _pair("half_rotary_gqa2")
    inputs = _cases("half_rotary_gqa2")["one_image"]
    try:
        model.cfg.rope_adjacent_pairs = False
        with torch.no_grad():
            wrong = model(inputs)
    finally:
        model.cfg.rope_adjacent_pairs = True
    assert (wrong - hf_logits(hf, inputs)).abs().max() > 1e-3


def test_regions_are_hfs_3d_positions():
    """Each image's grid cell (row, col) of regions is the (h, w) HF's get_rope_index gives the token, less the
    image's first position; the markers are the begin / end tags around it."""
    hf, model = _pair("full_rotary_mqa")
    for case in ("two_images_different_sizes", "left_padded_batch", "mixed_batch_with_text_only_row"):
        inputs = _cases("full_rotary_mqa")[case]
        positions, _ = hf.model.get_rope_index(inputs.input_ids, mm_token_type_ids=inputs.mm_token_type_ids,
                                               image_grid_thw=inputs.image_grid_thw,
                                               attention_mask=inputs.attention_mask)
        tokens = [model.to_str_tokens(inputs.input_ids[row]) for row in range(inputs.batch_size)]
        for row in range(inputs.batch_size):
            for image, (rows, cols) in enumerate(inputs.regions.image_grid[row]):
                view = inputs.regions.image_view(row, image).positions
                index = torch.arange(rows * cols)
                h, w = positions[1, row, view], positions[2, row, view]
                assert torch.equal(h - h.min(), index // cols) and torch.equal(w - w.min(), index % cols)
            for marks in inputs.regions.markers[row] if row < len(inputs.regions.markers) else []:
                assert [tokens[row][int(m.positions[0])] for m in marks] == ["<|begin_of_image|>", "<|end_of_image|>"]


@pytest.mark.parametrize("shape", list(SHAPES))
def test_decoder_hooks_and_edits(shape):
    """Hook shapes; the heads and the bias add up to the attention output before ln1_post, and through it to
    hook_attn_out; a hook_z edit and a scores edit equal the same edits in HF."""
    from vlens.lens.decomposition import (
        layer_bias_contribution,
        layer_head_contributions,
        reconstruct_attn_out,
    )

    hf, model = _pair(shape)
    inputs = _cases(shape)["left_padded_batch"]
    cache = assert_hook_shapes(model, inputs)
    assert cache["blocks.0.ln1_post.hook_normalized"].shape == cache["blocks.0.hook_attn_out"].shape
    assert cache["blocks.0.ln2_post.hook_normalized"].shape == cache["blocks.0.hook_mlp_out"].shape
    n_tokens = sum(len(r) for r in inputs.regions.image)
    assert cache["vision.hook_image_features"].shape == (n_tokens, model.cfg.d_model)
    for layer in range(model.cfg.n_layers):
        shares = layer_head_contributions(model, cache, layer)
        bias = layer_bias_contribution(model, cache, layer)
        torch.testing.assert_close(reconstruct_attn_out(shares, bias), cache[f"blocks.{layer}.hook_attn_out"],
                                   atol=1e-5, rtol=1e-5)
    assert_hook_z_edit_matches_hf(model, hf, inputs, layer=1, head=1)
    assert_scores_edit_matches_scaling_q(model, hf, inputs, layer=0, head=2)


@pytest.mark.parametrize("shape", list(SHAPES))
def test_mlp_hooks_are_the_fused_halves(shape):
    """hook_pre / hook_pre_linear are the gate and up halves of HF's gate_up_proj; scaling hook_post equals
    scaling down_proj's input in HF."""
    hf, model = _pair(shape)
    inputs = _cases(shape)["one_image"]
    seen = {}
    mlp = model.adapter.language_model(hf).layers[1].mlp
    handle = mlp.gate_up_proj.register_forward_hook(lambda m, a, out: seen.setdefault("out", out.detach()))
    try:
        _, cache = model.run_with_cache(inputs, names_filter=lambda n: n.startswith("blocks.1.mlp.hook_pre"))
    finally:
        handle.remove()
    gate, up = seen["out"].chunk(2, dim=-1)
    torch.testing.assert_close(cache["blocks.1.mlp.hook_pre"], gate, atol=0, rtol=0)
    torch.testing.assert_close(cache["blocks.1.mlp.hook_pre_linear"], up, atol=0, rtol=0)
    torch.testing.assert_close(model.blocks[1].mlp.W_gate.T, mlp.gate_up_proj.weight[:model.cfg.d_mlp])
    with torch.no_grad():
        ours = model.run_with_hooks(inputs, fwd_hooks=[("blocks.1.mlp.hook_post", lambda x, hook: x * 0.3)])
    expected = hf_logits(hf, inputs, pre_hooks=[(mlp.down_proj, lambda m, a: (a[0] * 0.3,))])
    torch.testing.assert_close(ours, expected, atol=1e-4, rtol=0)


@pytest.mark.parametrize("shape", list(SHAPES))
def test_vision_hook_edits_equal_hf_edits(shape):
    """A vision block's output, one vision head, the merger's input and the image embeddings: each edit equals
    the same edit on HF's tower."""
    hf, model = _pair(shape)
    inputs = _cases(shape)["two_images_different_sizes"]
    visual = hf.model.visual
    heads, width = visual.config.num_heads, visual.config.hidden_size
    d_head = width // heads
    shift = torch.linspace(-1, 1, width)
    delta = torch.linspace(-1, 1, model.cfg.d_model)

    def ours(name, fn):
        with torch.no_grad():
            return model.run_with_hooks(inputs, fwd_hooks=[(name, fn)])

    def drop_head(z, hook):
        z = z.clone()
        z[..., 1, :] = 0
        return z

    def drop_head_hf(module, args):
        x = args[0].clone()
        x[..., d_head:2 * d_head] = 0
        return (x,)

    plain = hf_logits(hf, inputs)
    pairs = [
        (ours("vision.blocks.1.hook_resid_post", lambda x, hook: x + shift),
         hf_logits(hf, inputs, forward_hooks=[(visual.blocks[1], lambda m, a, out: out + shift)])),
        (ours("vision.blocks.0.attn.hook_z", drop_head),
         hf_logits(hf, inputs, pre_hooks=[(visual.blocks[0].attn.proj, drop_head_hf)])),
        # an added vector (the merger starts with a projection and a LayerNorm, which would undo a scale)
        (ours("vision.hook_image_features", lambda x, hook: x + delta),
         hf_logits(hf, inputs, pre_hooks=[(visual.merger, lambda m, a: (a[0] + delta,))])),
        (ours("vision.hook_image_embeds", lambda x, hook: x * 0),
         hf_logits(hf, inputs, forward_hooks=[(visual.merger, lambda m, a, out: out * 0)])),
    ]
    for got, expected in pairs:
        torch.testing.assert_close(got, expected, atol=1e-4, rtol=0)
        assert (got - plain).abs().max() > 1e-4


@pytest.mark.parametrize("shape,case", [("half_rotary_gqa2", "left_padded_batch"),
                                        ("half_rotary_gqa2", "two_images_different_sizes"),
                                        ("full_rotary_mqa", "text_only_padded_batch"),
                                        ("full_rotary_mqa", "mixed_batch_with_text_only_row")])
def test_greedy_generate_matches_hf(shape, case):
    hf, model = _pair(shape)
    assert_generate_matches_hf(model, hf, _cases(shape)[case])


def test_bf16_within_hf_bf16_noise():
    hf, model = _pair("half_rotary_gqa2")
    assert_bf16_within_hf_noise(hf, model.processor, lambda m: m.prepare(
        images=[random_image(50, 30, 1), random_image(30, 44, 2)], prompts=["How many dots are there?", "red"]))


def test_prompt_format_and_no_hooks_left():
    hf, model = _pair("full_rotary_mqa")
    inputs = model.prepare(images=[random_image(30, 30, 1)], prompts=["How many dots are there?"])
    tokens = [t for t in model.to_str_tokens(inputs.input_ids[0]) if t != "<|image|>"]
    assert tokens == ["[gMASK]", "<sop>", "<|user|>", "\n", "<|begin_of_image|>", "<|end_of_image|>", "How", "many",
                      "dots", "are", "there", "?", "<|assistant|>", "\n"]
    assert model.adapter.fallback_chat_prompt("red ?", 1) == \
        "[gMASK]<sop><|user|>\n<|begin_of_image|><|image|><|end_of_image|>red ?<|assistant|>\n"
    assert_no_hooks_left_after_exception(model, _cases("full_rotary_mqa")["one_image"],
                                         ["vision.hook_image_features", "blocks.1.ln1_post.hook_scale",
                                          "blocks.1.attn.hook_attn_scores", "vision.blocks.0.attn.hook_z"])


def test_videos_and_bad_inputs_are_clear_errors():
    hf, model = _pair("half_rotary_gqa2")
    kwargs = _cases("half_rotary_gqa2")["one_image"].to_hf_kwargs()
    with pytest.raises(UserInputError, match="images only"):
        model(**kwargs, pixel_values_videos=kwargs["pixel_values"], video_grid_thw=kwargs["image_grid_thw"])
    with pytest.raises(UserInputError, match="image_grid_thw"):
        model(**{k: v for k, v in kwargs.items() if k != "image_grid_thw"})


def test_saved_checkpoint_loads_with_its_processor(tmp_path):
    hf, model = _pair("full_rotary_mqa")
    assert_saved_checkpoint_loads(hf, model.processor, tmp_path, [random_image(70, 40, 1), random_image(30, 64, 2)])

"""Attention knockout (`vlens.flow.knockout`): equal to setting `hook_attn_scores` to -inf by hand on
several families (grouped-query, sliding-window and bidirectional image blocks, a hybrid decoder's
softmax layers), on the fast path (an edited SDPA mask) and the explicit one, per head too; a model
where one edge carries the answer; clear errors; nothing left behind."""

from __future__ import annotations

import pytest
import torch
from PIL import Image

from tests.helpers.models import tiny_vlm
from tests.helpers.one_edge import one_edge_model, plant_answers
from vlens.core.generation import continuation_inputs
from vlens.flow import knockout, position_mask
from vlens.utils.errors import UserInputError

torch.set_num_threads(1)

FAMILIES = {
    "qwen2_5_vl": dict(n_layers=3, d_model=40, n_heads=4, n_kv_heads=2, d_mlp=24),  # grouped-query
    "llava": dict(n_layers=2, d_model=36, n_heads=6, n_kv_heads=3, d_mlp=20),
    "gemma3": dict(n_layers=3, d_model=32, n_heads=4, n_kv_heads=2, d_head=8, d_mlp=48, sliding_window=5,
                   layer_types=("sliding_attention", "full_attention", "sliding_attention")),
    "qwen3_5": {},  # Gated DeltaNet and gated softmax layers
    "llava_next": {},  # anyres: base view, tiles and newline tokens are all "image"
}


def _image(width: int, height: int, seed: int) -> Image.Image:
    generator = torch.Generator().manual_seed(seed)
    pixels = torch.randint(0, 256, (height, width, 3), generator=generator, dtype=torch.uint8)
    return Image.fromarray(pixels.numpy())


def _inputs(model, n: int = 2):
    images = [_image(40 + 8 * i, 32 + 16 * i, i) for i in range(n)]
    prompts = ["How many dots are there?", "What colour is the circle?", "Is there a square?"][:n]
    return model.prepare(images=images, prompts=prompts)


def _by_hand(model, inputs, src, dst, layers, heads=None):
    """Logits with the blocked scores set to -inf in `hook_attn_scores` (the explicit path)."""
    block = position_mask(dst, inputs)[:, None, :, None] & position_mask(src, inputs)[:, None, None, :]

    def hook(scores, hook):
        mask = block.to(scores.device).expand(-1, scores.shape[1], -1, -1).clone()
        if heads is not None:
            keep = torch.ones(scores.shape[1], dtype=torch.bool)
            keep[list(heads)] = False
            mask[:, keep] = False
        return scores.masked_fill(mask, float("-inf"))

    return model.run_with_hooks(inputs, fwd_hooks=[(f"blocks.{layer}.attn.hook_attn_scores", hook) for layer in layers])


def _explicit(model, inputs):
    """A forward on the explicit attention path (a hook reads every pattern)."""
    return model.run_with_hooks(inputs, fwd_hooks=[(lambda name: name.endswith("hook_pattern"), lambda x, hook: x)])


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("src, dst, heads", [("image", "final", None), ("question", "final", (1, 2)),
                                             ("image", "all", (0,))])
def test_knockout_equals_editing_the_scores_by_hand(family, src, dst, heads):
    model = tiny_vlm(family, **FAMILIES[family])
    inputs = _inputs(model)
    layers = [layer for layer in range(model.cfg.n_layers) if not model.cfg.is_linear_attention(layer)][-2:]
    with torch.no_grad():
        clean = model(inputs)
        expected = _by_hand(model, inputs, src, dst, layers, heads)
        with knockout(model, src, dst, layers=layers, heads=heads, inputs=inputs):
            fast = model(inputs)
            explicit = _explicit(model, inputs)
    real = inputs.attention_mask.bool()
    assert (expected - clean)[real].abs().max() > 1e-3  # the knockout changes something
    torch.testing.assert_close(explicit[real], expected[real], atol=1e-6, rtol=0)
    torch.testing.assert_close(fast[real], expected[real], atol=1e-4, rtol=0)
    assert all(not getattr(block.attn, "mask_edits", []) for block in model.blocks)


def test_gemma3_bidirectional_image_block_can_be_cut():
    """Image tokens of one image see each other (both ways): image -> image knockout cuts the block too."""
    model = tiny_vlm("gemma3", **FAMILIES["gemma3"])
    inputs = _inputs(model)
    with torch.no_grad():
        expected = _by_hand(model, inputs, "image", "image", [1])
        with knockout(model, "image", "image", layers=[1], inputs=inputs) as edit:
            fast = model(inputs)
    real = inputs.attention_mask.bool()
    torch.testing.assert_close(fast[real], expected[real], atol=1e-4, rtol=0)
    # image tokens still read the text before them, so no query is left without a key
    assert edit.src.sum() == sum(len(p) for p in inputs.regions.image)


def test_hybrid_linear_attention_layers_are_refused():
    model = tiny_vlm("qwen3_5", **FAMILIES["qwen3_5"])
    linear = model.cfg.linear_attention_layers
    assert linear
    inputs = _inputs(model, 1)
    with pytest.raises(UserInputError, match="linear attention"):
        with knockout(model, "image", "final", layers=[linear[0]], inputs=inputs):
            pass


def test_one_edge_model_only_the_carrying_edge_removes_the_answer():
    model = one_edge_model(carrier=1, n_layers=3)
    inputs = _inputs(model, 3)
    answers = [5, 7, 9]
    plant_answers(model, inputs, answers)
    rows, final = torch.arange(3), inputs.regions.final

    def final_logits(src=None, dst=None, layers=None):
        with torch.no_grad():
            if src is None:
                return model(inputs)[rows, final]
            with knockout(model, src, dst, layers=layers, inputs=inputs):
                return model(inputs)[rows, final]

    clean = final_logits()
    assert clean.argmax(-1).tolist() == answers
    cut = final_logits("image", "final", [1])
    assert torch.equal(cut, torch.zeros_like(cut))  # the answer is gone: every logit 0, p = 1 / d_vocab
    for layers in ([0], [2], [0, 2]):  # the same edge at the layers that carry nothing
        torch.testing.assert_close(final_logits("image", "final", layers), clean, atol=1e-6, rtol=0)
    torch.testing.assert_close(final_logits("image", "question", [0, 1, 2]), clean, atol=1e-6, rtol=0)
    renormalised = final_logits("question", "final", [1])
    assert renormalised.argmax(-1).tolist() == answers
    assert (renormalised - clean).abs().max() > 1e-3  # the carrier's pattern did change


def test_errors_and_cleanup():
    model = tiny_vlm("qwen2_5_vl", **FAMILIES["qwen2_5_vl"])
    inputs = _inputs(model)
    with pytest.raises(UserInputError, match="no key left"):
        with knockout(model, "all", "final", layers=[0], inputs=inputs):
            model(inputs)
    assert all(not block.attn.mask_edits for block in model.blocks)  # removed on error
    with pytest.raises(UserInputError, match="do not exist"):
        with knockout(model, "image", "final", layers=[7], inputs=inputs):
            pass
    with pytest.raises(UserInputError, match="heads"):
        with knockout(model, "image", "final", layers=[0], heads=[9], inputs=inputs):
            pass
    with pytest.raises(UserInputError, match="unknown region"):
        with knockout(model, "imag", "final", inputs=inputs):
            pass
    with pytest.raises(UserInputError, match="needs inputs"):
        with knockout(model, "image", "final"):
            pass
    other = _inputs(model, 3)
    with pytest.raises(UserInputError, match="batch of 2"):
        with knockout(model, "image", "final", layers=[0], inputs=inputs):
            model(other)
    assert all(not block.attn.mask_edits for block in model.blocks)


def test_object_boxes_on_every_view_of_a_tiled_image():
    """An object's tokens from `from_box` (base view and tiles of LLaVA-NeXT) as per-row selections."""
    model = tiny_vlm("llava_next", **FAMILIES["llava_next"])
    inputs = _inputs(model)
    objects = [inputs.regions.from_box(row, (2.0, 2.0, 20.0, 16.0)) for row in range(2)]
    layers = [model.cfg.n_layers - 1]
    with torch.no_grad():
        expected = _by_hand(model, inputs, objects, "final", layers)
        with knockout(model, objects, "final", layers=layers, inputs=inputs) as edit:
            fast = model(inputs)
    real = inputs.attention_mask.bool()
    torch.testing.assert_close(fast[real], expected[real], atol=1e-4, rtol=0)
    assert edit.src.sum(1).tolist() == [len(o.positions) for o in objects]


def test_final_tensor_means_each_rows_final_position():
    model = tiny_vlm("qwen2_5_vl", **FAMILIES["qwen2_5_vl"])
    inputs = _inputs(model)
    with knockout(model, "image", inputs.regions.final, layers=[0], inputs=inputs) as edit:
        pass
    assert torch.equal(edit.dst, position_mask("final", inputs))
    per_row = [inputs.regions.image[0][:3], inputs.regions.image[1][-2:]]
    mask = position_mask(per_row, inputs)
    assert mask.sum(1).tolist() == [3, 2]


@pytest.mark.parametrize("family", ["qwen2_5_vl", "gemma3"])
def test_knockout_during_generation_equals_whole_forwards(family):
    """Under generate (KV cache, Gemma 3's sliding windows) the prompt's knocked-out edges stay knocked out
    and the new tokens (in neither set) attend as usual: each new token is the argmax of a whole forward
    of the sequence so far under the same knockout."""
    model = tiny_vlm(family, **FAMILIES[family])
    inputs = _inputs(model, 1)
    with torch.no_grad(), knockout(model, "image", "final", layers=[0, 1], inputs=inputs):
        tokens = model.generate(inputs, max_new_tokens=3, stop_at_eos=False).tokens
        for step in range(tokens.shape[1]):
            longer = continuation_inputs(model, inputs, tokens[:, :step]) if step else inputs
            assert int(model(longer)[0, -1].argmax()) == int(tokens[0, step])

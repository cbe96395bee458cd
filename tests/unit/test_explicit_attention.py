"""The explicit attention path (the one that hooks the pattern) computes HF eager attention exactly while it
reuses the scores' memory for the pattern: every row (padding included) against HF's own eager attention, and
the in-place softmax against the out-of-place one where it may overwrite and where it may not."""

from __future__ import annotations

import functools
import math

import torch

from vlens import HookedVLM
from vlens.core.components.attention import eager_softmax
from vlens.testing import random_image, tiny_hf_model, tiny_qwen_processor


@functools.lru_cache(maxsize=1)
def _model() -> HookedVLM:
    return HookedVLM.from_hf(tiny_hf_model("qwen2_5_vl"), processor=tiny_qwen_processor())


def _known_rows() -> torch.Tensor:
    """[1, 1, 3, 3] scores whose softmax is known: (1/3, 2/3, 0), one fully masked row (uniform), (1, 0, 0)."""
    lowest = torch.finfo(torch.float32).min
    return torch.tensor([[[[0.0, math.log(2.0), lowest], [lowest, lowest, lowest], [5.0, lowest, lowest]]]])


def test_softmax_overwrites_the_scores_only_where_it_is_the_same_kernel():
    expected = torch.tensor([[[[1 / 3, 2 / 3, 0.0], [1 / 3, 1 / 3, 1 / 3], [1.0, 0.0, 0.0]]]])
    scores = _known_rows()
    pattern = eager_softmax(scores)
    assert pattern.data_ptr() == scores.data_ptr()  # fp32 on a CPU without autograd: in place
    torch.testing.assert_close(pattern, expected, atol=1e-7, rtol=0)
    assert torch.equal(pattern, torch.softmax(_known_rows(), dim=-1, dtype=torch.float32))

    leaf = _known_rows().requires_grad_(True)
    scores = leaf * 1.0  # autograd records the softmax: a new tensor, the scores untouched
    pattern = eager_softmax(scores)
    assert pattern.data_ptr() != scores.data_ptr() and torch.equal(scores, _known_rows())
    assert torch.equal(pattern, torch.softmax(_known_rows(), dim=-1))
    pattern[0, 0, 0, 1].backward()  # d p1 / d s = p1 (onehot - p): (-2/9, 2/9, 0)
    torch.testing.assert_close(leaf.grad[0, 0, 0], torch.tensor([-2 / 9, 2 / 9, 0.0]), atol=1e-7, rtol=0)

    half = torch.randn(2, 3, 5, 7).to(torch.bfloat16)
    kept = half.clone()
    pattern = eager_softmax(half)  # softmax in fp32, cast back (HF eager), never in the bf16 buffer
    assert pattern.dtype == torch.bfloat16 and torch.equal(half, kept)
    assert torch.equal(pattern, torch.softmax(kept, dim=-1, dtype=torch.float32).to(torch.bfloat16))


def test_every_row_of_the_pattern_equals_hf_eager_and_the_scores_path():
    model = _model()
    hf = model.hf_model
    # a left-padded batch: the padding queries see no key, and eager attention averages every value there
    inputs = model.prepare(images=[random_image(56, 84, 1), random_image(56, 56, 2)],
                           prompts=["How many dots are there?", "red"])
    assert not inputs.attention_mask.bool().all()
    with torch.no_grad():
        expected = hf(**inputs.to_hf_kwargs(), output_attentions=True).attentions
    logits, cache = model.run_with_cache(inputs)
    scored_logits, scored = model.run_with_cache(inputs, attn_scores=True)
    for layer, pattern in enumerate(expected):
        name = f"blocks.{layer}.attn.hook_pattern"
        torch.testing.assert_close(cache[name], pattern, atol=1e-6, rtol=0, msg=name)
        padding_rows = cache[name].transpose(1, 2)[~inputs.attention_mask.bool()]  # [n, heads, key]
        torch.testing.assert_close(padding_rows, torch.full_like(padding_rows, 1 / inputs.seq_len), atol=1e-7, rtol=0)
    # the path with the scores hooked computes the same thing from a fresh tensor: every activation equal
    assert set(cache.cache_dict) <= set(scored.cache_dict)
    for name, value in cache.cache_dict.items():
        assert torch.equal(value, scored[name]), name
    assert torch.equal(logits, scored_logits)
    with torch.no_grad():
        torch.testing.assert_close(logits, hf(**inputs.to_hf_kwargs()).logits, atol=1e-5, rtol=0)

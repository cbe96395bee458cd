"""The explicit attention path (the one that hooks the pattern) computes HF eager attention exactly while it
reuses the scores' memory for the pattern and, under a plain causal mask, multiplies only the blocks of
queries and keys that are not all masked: every row (padding included) against HF's own eager attention,
the in-place softmax against the out-of-place one where it may overwrite and where it may not, and the
blocked causal scores against the whole matmul, bit for bit."""

from __future__ import annotations

import functools
import itertools
import math

import pytest
import torch

from vlens import HookedVLM
from vlens.core.components import attention
from vlens.core.components.attention import causal_scores, eager_softmax
from vlens.core.runtime import build_masks
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


def _padding(batch: int, n: int) -> torch.Tensor:
    """[batch, n] attention masks: a full row, left padding, right padding, holes (HF ANDs any with causal)."""
    mask = torch.ones(batch, n, dtype=torch.long)
    mask[1, : n // 3] = 0
    mask[2, n - max(n // 4, 1):] = 0
    mask[3, ::3] = 0
    mask[3, -1] = 1
    return mask


def test_causal_scores_are_the_whole_matmuls_bits():
    # lengths around the block size (a last block of one or two rows would round differently), rows with
    # and without padding, head sizes unlike the defaults, queries and keys strided as the attention passes them
    for n, d, dtype in itertools.product([1, 7, 64, 65, 129, 130, 200], [8, 24], [torch.float32, torch.bfloat16]):
        generator = torch.Generator().manual_seed(n + d)
        q, k = (torch.randn(4, n, 3, d, generator=generator).to(dtype).transpose(1, 2) for _ in range(2))
        masks = build_masks(_padding(4, n) if n > 1 else None, 4, n, 0, dtype, torch.device("cpu"))
        assert masks.causal_keys is not None
        lowest = torch.finfo(dtype).min
        expected = torch.matmul(q, k.transpose(2, 3)).mul_(d ** -0.5).masked_fill_(~masks.allowed, lowest)
        bits = torch.int32 if dtype == torch.float32 else torch.int16
        got = causal_scores(q, k, d ** -0.5, masks.causal_keys)
        assert torch.equal(got.view(bits), expected.view(bits)), (n, d, dtype)
    plain = torch.matmul(q, k.transpose(2, 3)).mul_(d ** -0.5).masked_fill_(torch.ones(n, n).triu(1).bool(), lowest)
    assert torch.equal(causal_scores(q, k, d ** -0.5).view(bits), plain.view(bits))  # keys=None: all


def test_causal_keys_are_recognised_only_where_the_mask_is_causal_and_keys():
    cpu = torch.device("cpu")
    plain = build_masks(None, 2, 9, 0, torch.float32, cpu)
    assert plain.causal_keys is not None and bool(plain.causal_keys.all())
    padded = build_masks(_padding(4, 9), 4, 9, 0, torch.float32, cpu)
    assert torch.equal(padded.causal_keys, _padding(4, 9).bool())
    knocked = padded.allowed.clone()
    knocked[:, :, 5, 2] = False  # query 5 no longer reads key 2, which query 6 still reads
    assert padded.restricted(knocked).causal_keys is None
    assert padded.windowed(4).causal_keys is None  # a window that cuts
    assert padded.windowed(20).causal_keys is not None  # one that cuts nothing is the mask itself
    blocks = torch.tensor([[-1, 0, 0, 0, -1, -1, -1, -1, -1]] * 4)  # an image block whose tokens see each other
    assert build_masks(_padding(4, 9), 4, 9, 0, torch.float32, cpu, blocks=blocks).causal_keys is None
    assert build_masks(None, 2, 1, 8, torch.float32, cpu).causal_keys is None  # a decoding step: not square


def test_causal_scores_serve_prompts_padded_or_not_outside_autograd(monkeypatch):
    model = _model()
    calls = []
    monkeypatch.setattr(attention, "causal_scores", lambda *args: calls.append(1) or causal_scores(*args))
    patterns = lambda name: name.endswith("hook_pattern")  # noqa: E731
    one = model.prepare(images=[random_image(56, 84, 1)], prompts=["How many dots are there?"])
    with torch.no_grad():
        model.run_with_cache(one, names_filter=patterns)
    assert len(calls) == model.cfg.n_layers
    model.run_with_cache(one, names_filter=patterns)  # the weights require grad: autograd records the whole matmul
    assert len(calls) == model.cfg.n_layers
    padded = model.prepare(images=[random_image(56, 84, 1), random_image(56, 56, 2)], prompts=["How many", "red"])
    with torch.no_grad():
        model.run_with_cache(padded, names_filter=patterns)
    assert len(calls) == 2 * model.cfg.n_layers


@pytest.mark.parametrize("padded", [True, False])
def test_every_row_of_the_pattern_equals_hf_eager_and_the_scores_path(padded):
    model = _model()
    hf = model.hf_model
    if padded:  # a left-padded batch: the padding queries see no key, and eager attention averages every value
        inputs = model.prepare(images=[random_image(56, 84, 1), random_image(56, 56, 2)],
                               prompts=["How many dots are there?", "red"])
        assert not inputs.attention_mask.bool().all()
    else:  # one prompt: a plain causal mask
        inputs = model.prepare(images=[random_image(56, 84, 1)], prompts=["How many dots are there?"])
    with torch.no_grad():
        expected = hf(**inputs.to_hf_kwargs(), output_attentions=True).attentions
        logits, cache = model.run_with_cache(inputs)  # in place, and blocked under a plain causal mask
        scored_logits, scored = model.run_with_cache(inputs, attn_scores=True)
    graph_logits, graph = model.run_with_cache(inputs)  # under autograd (the weights require grad): out of place
    assert graph_logits.requires_grad
    for layer, pattern in enumerate(expected):
        name = f"blocks.{layer}.attn.hook_pattern"
        torch.testing.assert_close(cache[name], pattern, atol=1e-6, rtol=0, msg=name)
        padding_rows = cache[name].transpose(1, 2)[~inputs.attention_mask.bool()]  # [n, heads, key]
        torch.testing.assert_close(padding_rows, torch.full_like(padding_rows, 1 / inputs.seq_len), atol=1e-7, rtol=0)
    # the path with the scores hooked computes the same thing from a fresh tensor: every activation equal
    assert set(cache.cache_dict) <= set(scored.cache_dict)
    for name, value in cache.cache_dict.items():
        assert torch.equal(value, scored[name]) and torch.equal(value, graph[name]), name
    assert torch.equal(logits, scored_logits) and torch.equal(logits, graph_logits)
    with torch.no_grad():
        torch.testing.assert_close(logits, hf(**inputs.to_hf_kwargs()).logits, atol=1e-5, rtol=0)


@pytest.mark.parametrize("grad", [False, True])
def test_the_pattern_under_bf16_autocast_is_hf_eagers(grad):
    """Under CPU bf16 autocast the scores' matmul gives bf16 from fp32 queries and keys: the mask value is the
    scores' dtype's (fp32's min overflowed bf16: the SFT trainer's bf16 step raised) and the pattern is cast to
    the queries' dtype, as HF eager does; with or without autograd, equal to HF eager under the same autocast."""
    model = _model()
    hf = model.hf_model
    inputs = model.prepare(images=[random_image(56, 84, 1), random_image(56, 56, 2)],
                           prompts=["How many dots are there?", "red"])
    with torch.set_grad_enabled(grad), torch.autocast("cpu", dtype=torch.bfloat16):
        expected = hf(**inputs.to_hf_kwargs(), output_attentions=True).attentions
        logits, cache = model.run_with_cache(inputs)
        reference = hf(**inputs.to_hf_kwargs()).logits
    assert logits.requires_grad == grad
    for layer, pattern in enumerate(expected):
        name = f"blocks.{layer}.attn.hook_pattern"
        assert cache[name].dtype == pattern.dtype, name
        torch.testing.assert_close(cache[name], pattern, atol=1e-2, rtol=0, msg=name)  # bf16 matmuls in both
    torch.testing.assert_close(logits.float(), reference.float(), atol=5e-2, rtol=0)

"""`generate`: greedy tokens equal HF's, hooks stay active at every step."""

from __future__ import annotations

import pytest
import torch

from tests.helpers.models import QWEN_FAMILIES
from vlens.testing import random_image


@pytest.mark.parametrize("family", QWEN_FAMILIES)
def test_greedy_generate_matches_hf(qwen_pair, family):
    hf, model = qwen_pair(family)
    inputs = model.prepare(images=[random_image(56, 56, 1), [random_image(84, 56, 2), random_image(56, 56, 3)]],
                           prompts=["How many dots are there?", "red"])
    out = model.generate(inputs, max_new_tokens=6)
    with torch.no_grad():
        expected = hf.generate(**inputs.to_hf_kwargs(), max_new_tokens=6, do_sample=False)
    new = expected[:, inputs.seq_len:]
    assert torch.equal(out.tokens[:, : new.shape[1]], new)
    assert torch.equal(out.sequences[:, : expected.shape[1]], expected)
    assert len(out.texts) == 2 and all(isinstance(t, str) for t in out.texts)


def test_generate_text_only_matches_hf(qwen_pair):
    hf, model = qwen_pair("qwen2_vl")
    inputs = model.prepare(prompts=["How many dots are there?"])
    out = model.generate(inputs, max_new_tokens=5)
    with torch.no_grad():
        expected = hf.generate(**inputs.to_hf_kwargs(), max_new_tokens=5, do_sample=False)
    assert torch.equal(out.tokens, expected[:, inputs.seq_len:])


def test_hooks_active_at_every_decoding_step(qwen_pair):
    hf, model = qwen_pair("qwen2_5_vl")
    inputs = model.prepare(images=[random_image(56, 56, 1)], prompts=["How many dots are there?"])
    seen = []
    out = model.generate(inputs, max_new_tokens=4,
                         fwd_hooks=[("blocks.0.attn.hook_z", lambda z, hook: seen.append(z.shape[1]))])
    assert seen[0] == inputs.seq_len and seen[1:] == [1] * (out.tokens.shape[1] - 1)
    assert all(not hp.fwd_hooks for hp in model.hook_dict.values())


def test_sampling_is_seeded(qwen_pair):
    hf, model = qwen_pair("qwen2_5_vl")
    inputs = model.prepare(images=[random_image(56, 56, 1)], prompts=["How many dots are there?"])
    a = model.generate(inputs, max_new_tokens=5, do_sample=True, temperature=1.5, top_p=0.9, seed=3)
    b = model.generate(inputs, max_new_tokens=5, do_sample=True, temperature=1.5, top_p=0.9, seed=3)
    assert torch.equal(a.tokens, b.tokens)


# ---------------------------------------------------------------------- TransformerLens's keywords
def _greedy_by_hand(model, inputs, n: int) -> torch.Tensor:
    """n greedy tokens by full forwards over the growing sequence (no cache, no stopping)."""
    ids, mask = inputs.input_ids, inputs.attention_mask
    extra = {k: v for k, v in inputs.to_hf_kwargs().items() if k not in ("input_ids", "attention_mask",
                                                                          "mm_token_type_ids")}
    new = []
    for _ in range(n):
        with torch.no_grad():
            logits = model(input_ids=ids, attention_mask=mask, **extra)
        token = logits[:, -1].argmax(-1)
        new.append(token)
        ids = torch.cat([ids, token[:, None]], dim=1)
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
    return torch.stack(new, dim=1)


def _batch(model):
    return model.prepare(images=[random_image(56, 56, 1), random_image(84, 56, 2)],
                         prompts=["How many dots are there?", "red"])


def test_without_the_kv_cache_the_tokens_are_the_same_hooks_included(qwen_pair):
    hf, model = qwen_pair("qwen2_5_vl")
    inputs = _batch(model)
    halve = [("blocks.1.attn.hook_z", lambda z, hook: z * 0.5)]  # position-independent: same in both paths
    for hooks in ((), halve):
        cached = model.generate(inputs, max_new_tokens=6, fwd_hooks=hooks)
        rerun = model.generate(inputs, max_new_tokens=6, fwd_hooks=hooks, use_past_kv_cache=False)
        assert torch.equal(cached.tokens, rerun.tokens)
    assert not torch.equal(model.generate(inputs, max_new_tokens=6).tokens, cached.tokens)  # the hook mattered
    assert all(not hp.fwd_hooks for hp in model.hook_dict.values())


def test_stop_at_eos_false_runs_every_step_as_greedy_decoding_by_hand(qwen_pair):
    hf, model = qwen_pair("qwen2_5_vl")
    inputs = _batch(model)
    out = model.generate(inputs, max_new_tokens=7, stop_at_eos=False)
    assert out.tokens.shape == (2, 7)
    assert torch.equal(out.tokens, _greedy_by_hand(model, inputs, 7))
    stopped = model.generate(inputs, max_new_tokens=7)  # by default a row ends at its first end token
    assert not torch.equal(stopped.tokens, out.tokens[:, : stopped.tokens.shape[1]])


def test_eos_token_id_stops_each_row_as_hf_does(qwen_pair):
    hf, model = qwen_pair("qwen2_5_vl")
    inputs = model.prepare(images=[random_image(56, 56, 1)], prompts=["How many dots are there?"])
    free = _greedy_by_hand(model, inputs, 6)[0]
    end = int(free[2])  # the third greedy token, used as the end token
    first = int((free == end).nonzero()[0])
    out = model.generate(inputs, max_new_tokens=6, eos_token_id=end)
    assert out.tokens[0].tolist() == free[: first + 1].tolist()
    with torch.no_grad():
        expected = hf.generate(**inputs.to_hf_kwargs(), max_new_tokens=6, do_sample=False, eos_token_id=end)
    assert torch.equal(out.sequences, expected)


def test_repetition_penalty_matches_hf_generate(qwen_pair):
    hf, model = qwen_pair("qwen2_5_vl")
    inputs = model.prepare(images=[random_image(56, 56, 1)], prompts=["How many dots are there?"])
    out = model.generate(inputs, max_new_tokens=8, repetition_penalty=1.8)
    with torch.no_grad():
        expected = hf.generate(**inputs.to_hf_kwargs(), max_new_tokens=8, do_sample=False, repetition_penalty=1.8)
    assert torch.equal(out.sequences[:, : expected.shape[1]], expected)
    assert not torch.equal(out.tokens, model.generate(inputs, max_new_tokens=8).tokens)  # the penalty changed them


def test_sampling_filters_equal_hf_logits_processors_and_tl_frequency_penalty():
    from transformers.generation.logits_process import (
        RepetitionPenaltyLogitsProcessor,
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    from vlens.core.generation import next_token_logits

    torch.manual_seed(0)
    logits = torch.randn(3, 50) * 3
    seen = torch.randint(0, 50, (3, 12))
    counts = torch.zeros(3, 50, dtype=torch.long).scatter_add_(1, seen, torch.ones_like(seen))
    ours = next_token_logits(logits, counts, do_sample=True, temperature=0.7, top_k=9, top_p=0.8,
                             repetition_penalty=1.3)
    theirs = RepetitionPenaltyLogitsProcessor(1.3)(seen, logits.clone())
    for warper in (TemperatureLogitsWarper(0.7), TopKLogitsWarper(9), TopPLogitsWarper(0.8)):
        theirs = warper(seen, theirs)
    assert torch.equal(torch.isinf(ours), torch.isinf(theirs))
    torch.testing.assert_close(ours.softmax(-1), theirs.softmax(-1))
    # TransformerLens's frequency penalty: logits / T - penalty * occurrences
    freq = next_token_logits(logits, counts, do_sample=True, temperature=0.5, freq_penalty=0.3)
    torch.testing.assert_close(freq, logits / 0.5 - 0.3 * counts)
    # greedy: only the repetition penalty applies
    assert torch.equal(next_token_logits(logits, counts, do_sample=False, temperature=0.5, top_k=2, freq_penalty=1.0),
                       logits)


def test_temperature_zero_and_top_k_one_are_greedy(qwen_pair):
    hf, model = qwen_pair("qwen2_5_vl")
    inputs = _batch(model)
    greedy = model.generate(inputs, max_new_tokens=5).tokens
    assert torch.equal(model.generate(inputs, max_new_tokens=5, do_sample=True, temperature=0.0).tokens, greedy)
    assert torch.equal(model.generate(inputs, max_new_tokens=5, do_sample=True, top_k=1, seed=1).tokens, greedy)


def test_return_type_follows_the_input_as_transformer_lens_does(qwen_pair):
    hf, model = qwen_pair("qwen2_5_vl")
    inputs = _batch(model)
    out = model.generate(inputs, max_new_tokens=4)
    assert torch.equal(model.generate(inputs, max_new_tokens=4, return_type="tokens"), out.sequences)
    tokens = model.to_tokens("How many dots")
    ids = model.generate(tokens, max_new_tokens=4)  # tokens in, tokens out: prompt and continuation
    assert isinstance(ids, torch.Tensor) and torch.equal(ids[:, : tokens.shape[1]], tokens)
    assert torch.equal(ids[:, tokens.shape[1]:], _greedy_by_hand(model, model.coerce_inputs(tokens), 4))
    text = model.generate("How many dots", max_new_tokens=4)  # text in, text out
    assert text == model.to_string(ids[0])
    # a list of texts is left-padded: each row continues as it does alone
    both = model.generate(["How many dots", "red"], max_new_tokens=4)
    assert both == [text, model.generate("red", max_new_tokens=4)]
    assert isinstance(model.generate("red", max_new_tokens=2, return_type="output").tokens, torch.Tensor)

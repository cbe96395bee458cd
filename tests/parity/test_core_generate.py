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

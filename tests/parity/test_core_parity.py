"""HookedVLM logits equal the HF model's (fp32, eager), on the core issue's input matrix."""

from __future__ import annotations

import pytest
import torch

from tests.helpers.arch_parity import assert_logits_match, input_matrix
from tests.helpers.models import QWEN_FAMILIES
from vlens.testing import random_image


def _cases(model):
    return input_matrix(model, [(56, 56), (56, 84), (112, 56), (56, 56), (84, 84), (56, 56)])


@pytest.mark.parametrize("family", QWEN_FAMILIES)
def test_logits_match_hf_eager(qwen_pair, family):
    hf, model = qwen_pair(family)
    assert_logits_match(model, hf, _cases(model))  # both attention paths, every position


@pytest.mark.parametrize("family", QWEN_FAMILIES)
def test_hf_keyword_form_equals_vlminputs(qwen_pair, family):
    hf, model = qwen_pair(family)
    inputs = _cases(model)["left_padded_batch"]
    kwargs = inputs.to_hf_kwargs()
    kwargs.pop("mm_token_type_ids")  # optional: derived from input_ids
    with torch.no_grad():
        torch.testing.assert_close(model(**kwargs), model(inputs), atol=0, rtol=0)


def test_sdpa_path_equals_explicit_path(qwen_pair):
    hf, model = qwen_pair("qwen2_5_vl")
    keep_pattern = [(lambda name: name.endswith("hook_pattern"), lambda pattern, hook: pattern)]
    for name, inputs in _cases(model).items():
        with torch.no_grad():
            fast = model(inputs)
            explicit = model.run_with_hooks(inputs, fwd_hooks=keep_pattern)
        torch.testing.assert_close(fast, explicit, atol=1e-5, rtol=0, msg=name)


def test_sdpa_path_matches_hf_sdpa_exactly(qwen_pair):
    hf, model = qwen_pair("qwen2_5_vl", attn="sdpa")
    inputs = _cases(model)["left_padded_batch"]
    mask = inputs.attention_mask.bool()
    with torch.no_grad():
        torch.testing.assert_close(model(inputs)[mask], hf(**inputs.to_hf_kwargs()).logits[mask], atol=1e-6, rtol=0)


def test_explicit_path_is_used_only_when_pattern_is_hooked(qwen_pair):
    hf, model = qwen_pair("qwen2_5_vl")
    attn = model.blocks[0].attn
    assert not attn.needs_pattern()
    with model.hooks(fwd_hooks=[("blocks.0.attn.hook_attn_scores", lambda x, hook: x)]):
        assert attn.needs_pattern()
        assert not model.blocks[1].attn.needs_pattern()
    assert not attn.needs_pattern()


@pytest.mark.parametrize("family", QWEN_FAMILIES)
def test_bf16_close_to_hf_bf16(family):
    from vlens import HookedVLM
    from vlens.testing import tiny_hf_model, tiny_qwen_processor

    hf = tiny_hf_model(family, dtype=torch.bfloat16)
    model = HookedVLM.from_hf(hf, processor=tiny_qwen_processor())
    inputs = model.prepare(images=[random_image(56, 56, 1), random_image(84, 56, 2)], prompts=["How many", "red"])
    with torch.no_grad():
        expected = hf(**inputs.to_hf_kwargs()).logits.float()
        ours = model(inputs).float()
        pattern_hook = [(lambda n: n.endswith("hook_pattern"), lambda x, hook: x)]
        explicit = model.run_with_hooks(inputs, fwd_hooks=pattern_hook).float()
    assert model.cfg.dtype == torch.bfloat16
    # explicit path == HF eager op for op; the SDPA kernel rounds differently in bf16
    torch.testing.assert_close(explicit, expected, atol=1e-6, rtol=0)
    assert (ours - expected).abs().max() < 0.1

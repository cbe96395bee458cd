"""run_with_cache with every hook keeps the pattern and leaves the attention scores out unless asked;
the explicit attention path computes the same pattern with or without a hook on the scores."""

from __future__ import annotations

import functools

import pytest
import torch

from vlens import HookedVLM
from vlens.testing import random_image, tiny_hf_model, tiny_qwen_processor


@functools.lru_cache(maxsize=1)
def _model() -> HookedVLM:
    return HookedVLM.from_hf(tiny_hf_model("qwen2_5_vl"), processor=tiny_qwen_processor())


def _inputs(model):
    return model.prepare(images=[random_image(56, 56, 1), random_image(84, 56, 2)], prompts=["How many dots?", "red"])


def test_every_hook_but_the_scores_by_default_and_the_scores_on_demand():
    model = _model()
    inputs = _inputs(model)
    logits, cache = model.run_with_cache(inputs)
    names = set(cache.cache_dict)
    scores = {n for n in model.hook_dict if n.endswith("hook_attn_scores")}
    assert scores and not names & scores
    _, full = model.run_with_cache(inputs, attn_scores=True)
    assert scores <= set(full.cache_dict)
    assert names == set(full.cache_dict) - scores  # every other hook that fires, the pattern included
    _, named = model.run_with_cache(inputs, names_filter=["blocks.0.attn.hook_attn_scores"])
    assert set(named.cache_dict) == {"blocks.0.attn.hook_attn_scores"}
    for layer in range(model.cfg.n_layers):  # the pattern is the softmax of the scores, whichever path made it
        name = f"blocks.{layer}.attn."
        torch.testing.assert_close(cache[name + "hook_pattern"], full[name + "hook_attn_scores"].softmax(-1),
                                   atol=1e-6, rtol=0)
        assert torch.equal(cache[name + "hook_pattern"], full[name + "hook_pattern"])
    torch.testing.assert_close(logits, model(inputs), atol=1e-5, rtol=0)  # explicit attention vs SDPA
    with pytest.raises(KeyError, match="attn_scores=True"):
        cache["blocks.0.attn.hook_attn_scores"]
    with pytest.raises(KeyError, match="attn_scores=True"):
        cache["attn_scores", 0]
    assert all(not hp.fwd_hooks for hp in model.hook_dict.values())


def test_pattern_only_path_equals_hf_eager_attention():
    model = _model()
    hf = model.hf_model
    inputs = _inputs(model)
    _, cache = model.run_with_cache(inputs, names_filter=lambda n: n.endswith("hook_pattern"))
    with torch.no_grad():
        expected = hf(**inputs.to_hf_kwargs(), output_attentions=True).attentions
    real = inputs.attention_mask.bool()
    for layer, pattern in enumerate(expected):
        ours = cache[f"blocks.{layer}.attn.hook_pattern"]
        torch.testing.assert_close(ours[real[:, None, :, None].expand_as(ours)],
                                   pattern[real[:, None, :, None].expand_as(pattern)], atol=1e-5, rtol=0)

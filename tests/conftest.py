"""Shared fixtures: tiny random models built offline (nothing is downloaded)."""

from __future__ import annotations

import functools

import pytest
import torch

torch.set_num_threads(1)

QWEN_FAMILIES = ["qwen2_vl", "qwen2_5_vl"]


@functools.lru_cache(maxsize=8)
def _cached_pair(family: str, attn: str, seed: int):
    from vlens import HookedVLM
    from vlens.testing import tiny_hf_model, tiny_qwen_processor

    hf = tiny_hf_model(family, seed=seed, attn_implementation=attn)
    return hf, HookedVLM.from_hf(hf, tiny_qwen_processor())


@pytest.fixture
def qwen_pair():
    """Factory: (hf_model, hooked_model) for a family; shared parameters, eager HF attention."""

    def make(family: str = "qwen2_5_vl", attn: str = "eager", seed: int = 0):
        hf, model = _cached_pair(family, attn, seed)
        model.reset_hooks(including_permanent=True)
        model.cfg.use_attn_result = False
        return hf, model

    return make

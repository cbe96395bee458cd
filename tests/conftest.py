"""Shared fixtures: tiny random models built offline (nothing is downloaded), one builder for every
test (`tests/helpers/models.py`, cached per configuration)."""

from __future__ import annotations

import pytest
import torch

from tests.helpers.models import tiny_pair, tiny_vlm

torch.set_num_threads(1)


@pytest.fixture
def qwen_pair():
    """Factory: (hf_model, hooked_model) for a family; shared parameters, eager HF attention."""

    def make(family: str = "qwen2_5_vl", attn: str = "eager", seed: int = 0):
        return tiny_pair(family, seed=seed, attn=attn)

    return make


@pytest.fixture
def tiny_vlm_factory():
    """Factory: a tiny random HookedVLM, `tiny_model(family, fresh=False, processor=None, **config)`."""
    return tiny_vlm

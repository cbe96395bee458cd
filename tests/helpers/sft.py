"""Small models, examples and settings shared by the fine-tuning tests."""

from __future__ import annotations

from tests.helpers.models import tiny_vlm
from vlens import HookedVLM
from vlens.data import render_syndot, render_synpoly
from vlens.training import SFTConfig, example_from_sample


def sft_model() -> HookedVLM:
    """A tiny random Qwen2.5-VL with the test tokenizer."""
    return tiny_vlm("qwen2_5_vl", fresh=True)  # fine-tuning changes it


def sft_examples(n: int = 6):
    """`n` SynDot / SynPoly counting examples with object centres (deterministic)."""
    out = []
    for i in range(n):
        render = render_syndot if i % 2 == 0 else render_synpoly
        out.append(example_from_sample(*render(1 + i % 4, seed=i, size=84)))
    return out


def sft_config(**kw) -> SFTConfig:
    """A few-step LoRA config, overridable by keyword."""
    base = dict(lora_rank=4, learning_rate=1e-2, epochs=1, batch_size=2, focus_layers=[1], checkpoint_every=1)
    return SFTConfig(**{**base, **kw})

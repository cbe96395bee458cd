"""Shared real-vocabulary fixtures: a tiny-width Qwen2.5-VL-7B-shaped model with the real Qwen tokenizer."""

from __future__ import annotations

import functools


@functools.lru_cache(maxsize=1)
def real_model():
    """A random HookedVLM (64-wide, 2 layers, real Qwen vocabulary and special ids), small images."""
    from vlens.testing.real_vocab import real_vocab_model

    return real_vocab_model("qwen2.5-vl-7b", tiny=True, n_layers=2, vision_depth=1, seed=0,
                            min_pixels=56 * 56, max_pixels=56 * 56)


def hand_logits(model, ids):
    """HF's own logits [pos, d_vocab] for one row of token ids (no images), fp32."""
    import torch

    with torch.no_grad():
        return model.hf_model(input_ids=torch.tensor([ids])).logits[0].float()

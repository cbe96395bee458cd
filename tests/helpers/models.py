"""The tiny random models of the tests: one builder for every family, cached per configuration.

    hf, model = tiny_pair("qwen2_5_vl", n_layers=2, d_model=32)    # shared, hooks reset
    model = tiny_vlm("llava", processor={"image_size": 32})         # the HookedVLM only
    model = tiny_vlm("qwen2_5_vl", fresh=True)                      # a new copy a test may change

A cached model is shared by every test that asks for the same configuration, so a test that
changes weights, adds LoRA or leaves torch hooks on the HF modules asks for `fresh=True`.
Nothing is downloaded: the models come from `vlens.testing`'s offline builders.
"""

from __future__ import annotations

import functools
from typing import Any

from vlens import HookedVLM, adapter_for
from vlens.testing.families import tiny_families, tiny_parts

# every family with a tiny model (vlens.testing.families: a new family's builders are found by name)
FAMILIES: tuple[str, ...] = tuple(tiny_families())
QWEN_FAMILIES: tuple[str, ...] = ("qwen2_vl", "qwen2_5_vl")
# the families vlens's LoRA trains and exports (the others refuse it by message: adapter.lora_refusal)
LORA_FAMILIES: tuple[str, ...] = tuple(f for f in FAMILIES if getattr(adapter_for(f), "lora_refusal", None) is None)


def build_pair(family: str = "qwen2_5_vl", seed: int = 0, attn: str = "eager", processor: dict | None = None,
               tokenizer: Any = None, **config: Any) -> tuple[Any, HookedVLM]:
    """A new (HF model, HookedVLM) pair sharing parameters: `config` goes to the family's config,
    `processor` to its processor builder, `tokenizer` to both."""
    if family not in FAMILIES:
        raise ValueError(f"unknown family {family!r}: one of {FAMILIES}")
    hf, made = tiny_parts(family, seed=seed, attn=attn, processor=processor, tokenizer=tokenizer, **config)
    return hf, HookedVLM.from_hf(hf, processor=made)


@functools.lru_cache(maxsize=32)
def _cached(family: str, seed: int, attn: str, processor: tuple, config: tuple) -> tuple[Any, HookedVLM]:
    return build_pair(family, seed, attn, dict(processor) or None, **dict(config))


def tiny_pair(family: str = "qwen2_5_vl", seed: int = 0, attn: str = "eager", fresh: bool = False,
              processor: dict | None = None, tokenizer: Any = None, **config: Any) -> tuple[Any, HookedVLM]:
    """(HF model, HookedVLM) of `family`: cached per configuration unless `fresh` (or a custom
    `tokenizer`, which is never shared); a cached model comes with no hooks and use_attn_result off."""
    if fresh or tokenizer is not None:
        return build_pair(family, seed, attn, processor, tokenizer, **config)
    hf, model = _cached(family, seed, attn, tuple(sorted((processor or {}).items())), tuple(sorted(config.items())))
    model.reset_hooks(including_permanent=True)
    model.cfg.use_attn_result = False
    return hf, model


def tiny_vlm(family: str = "qwen2_5_vl", seed: int = 0, fresh: bool = False, processor: dict | None = None,
             tokenizer: Any = None, **config: Any) -> HookedVLM:
    """The HookedVLM of `tiny_pair`."""
    return tiny_pair(family, seed, fresh=fresh, processor=processor, tokenizer=tokenizer, **config)[1]

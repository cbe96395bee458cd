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

from vlens import HookedVLM
from vlens.testing import (
    tiny_aya_vision_model,
    tiny_aya_vision_processor,
    tiny_gemma3_model,
    tiny_gemma3_processor,
    tiny_gemma4_model,
    tiny_gemma4_processor,
    tiny_glm4v_model,
    tiny_glm4v_moe_model,
    tiny_glm4v_processor,
    tiny_hf_model,
    tiny_idefics2_model,
    tiny_idefics2_processor,
    tiny_idefics3_model,
    tiny_idefics3_processor,
    tiny_internvl_model,
    tiny_internvl_processor,
    tiny_lfm2_vl_model,
    tiny_lfm2_vl_processor,
    tiny_llama4_model,
    tiny_llama4_processor,
    tiny_llava_model,
    tiny_llava_next_model,
    tiny_llava_next_processor,
    tiny_llava_next_video_model,
    tiny_llava_next_video_processor,
    tiny_llava_onevision_model,
    tiny_llava_onevision_processor,
    tiny_llava_processor,
    tiny_mistral3_model,
    tiny_mistral3_processor,
    tiny_molmo2_model,
    tiny_molmo2_processor,
    tiny_paligemma_model,
    tiny_paligemma_processor,
    tiny_qwen3_5_model,
    tiny_qwen3_5_moe_model,
    tiny_qwen3_vl_model,
    tiny_qwen3_vl_moe_model,
    tiny_qwen3_vl_processor,
    tiny_qwen_processor,
    tiny_smolvlm_model,
    tiny_smolvlm_processor,
)

FAMILIES: tuple[str, ...] = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "llava", "qwen3_vl_moe", "qwen3_5", "qwen3_5_moe",
                            "llava_next", "llava_onevision", "llava_next_video", "gemma3", "internvl", "idefics3",
                            "smolvlm", "paligemma", "idefics2", "glm4v", "glm4v_moe", "mistral3", "lfm2_vl",
                            "aya_vision", "gemma4", "molmo2", "llama4")
# the Qwen3-VL-processor families (16 px patches) beyond Qwen3-VL itself: builder by family
QWEN3_BUILDERS = {"qwen3_vl": tiny_qwen3_vl_model, "qwen3_vl_moe": tiny_qwen3_vl_moe_model,
                  "qwen3_5": tiny_qwen3_5_model, "qwen3_5_moe": tiny_qwen3_5_moe_model}
QWEN_FAMILIES: tuple[str, ...] = ("qwen2_vl", "qwen2_5_vl")


def build_pair(family: str = "qwen2_5_vl", seed: int = 0, attn: str = "eager", processor: dict | None = None,
               tokenizer: Any = None, **config: Any) -> tuple[Any, HookedVLM]:
    """A new (HF model, HookedVLM) pair sharing parameters: `config` goes to the family's config,
    `processor` to its processor builder, `tokenizer` to both."""
    if family not in FAMILIES:
        raise ValueError(f"unknown family {family!r}: one of {FAMILIES}")
    options = {"tokenizer": tokenizer} if tokenizer is not None else {}
    if family in QWEN3_BUILDERS:
        hf = QWEN3_BUILDERS[family](seed=seed, attn_implementation=attn, **options, **config)
        made = tiny_qwen3_vl_processor(**options, **(processor or {}))
    elif family == "llava":
        hf = tiny_llava_model(seed=seed, attn_implementation=attn, **options, **config)
        made = tiny_llava_processor(**options, **(processor or {}))
    elif family == "gemma3":
        hf = tiny_gemma3_model(seed=seed, attn_implementation=attn, **options, **config)
        made = tiny_gemma3_processor(**options, **(processor or {}))
    elif family == "gemma4":  # the processor's patches and pooling are the tower's
        hf = tiny_gemma4_model(seed=seed, attn_implementation=attn, **options, **config)
        sizes = {k: config[k] for k in ("patch_size", "pooling_kernel_size") if k in config}
        made = tiny_gemma4_processor(**options, **sizes, **(processor or {}))
    elif family == "mistral3":  # the processor's patches and merge are the model's
        hf = tiny_mistral3_model(seed=seed, attn_implementation=attn, **options, **config)
        sizes = {k: config[k] for k in ("patch_size", "merge") if k in config}
        made = tiny_mistral3_processor(**options, **sizes, **(processor or {}))
    elif family == "lfm2_vl":  # the processor's patches and downsampling are the model's
        hf = tiny_lfm2_vl_model(seed=seed, attn_implementation=attn, **options, **config)
        sizes = {k: config[k] for k in ("patch_size", "factor") if k in config}
        made = tiny_lfm2_vl_processor(**options, **sizes, **(processor or {}))
    elif family == "molmo2":  # the processor's crops and patches are the tower's
        hf = tiny_molmo2_model(seed=seed, attn_implementation=attn, **options, **config)
        sizes = {k: config[k] for k in ("crop", "patch_size") if k in config}
        made = tiny_molmo2_processor(**options, **sizes, **(processor or {}))
    elif family == "paligemma":  # the processor's patch grid is the tower's
        hf = tiny_paligemma_model(seed=seed, attn_implementation=attn, **options, **config)
        sizes = {k: config[k] for k in ("image_size", "patch_size") if k in config}
        made = tiny_paligemma_processor(**options, **sizes, **(processor or {}))
    elif family in ("llava_next", "llava_onevision", "llava_next_video"):  # the processor tiles as the config does
        build_model, build_processor = {
            "llava_next": (tiny_llava_next_model, tiny_llava_next_processor),
            "llava_onevision": (tiny_llava_onevision_model, tiny_llava_onevision_processor),
            "llava_next_video": (tiny_llava_next_video_model, tiny_llava_next_video_processor)}[family]
        hf = build_model(seed=seed, attn_implementation=attn, **options, **config)
        tiling = {k: config[k] for k in ("tile", "patch_size", "pinpoints", "vision_aspect_ratio") if k in config}
        made = build_processor(**options, **tiling, **(processor or {}))
    elif family == "internvl":  # the processor tiles as the config does
        hf = tiny_internvl_model(seed=seed, attn_implementation=attn, **options, **config)
        tiling = {k: config[k] for k in ("tile", "patch_size", "downsample_ratio") if k in config}
        made = tiny_internvl_processor(**options, **tiling, **(processor or {}))
    elif family == "llama4":  # the processor tiles as the config does
        hf = tiny_llama4_model(seed=seed, attn_implementation=attn, **options, **config)
        tiling = {k: config[k] for k in ("tile", "patch_size") if k in config}
        made = tiny_llama4_processor(**options, **tiling, **(processor or {}))
    elif family == "aya_vision":  # the processor tiles as the config does
        hf = tiny_aya_vision_model(seed=seed, attn_implementation=attn, **options, **config)
        tiling = {k: config[k] for k in ("tile", "patch_size", "downsample") if k in config}
        made = tiny_aya_vision_processor(**options, **tiling, **(processor or {}))
    elif family in ("idefics3", "smolvlm"):  # the processor splits as the config does
        build_model, build_processor = ((tiny_idefics3_model, tiny_idefics3_processor) if family == "idefics3"
                                        else (tiny_smolvlm_model, tiny_smolvlm_processor))
        hf = build_model(seed=seed, attn_implementation=attn, **options, **config)
        splitting = {k: config[k] for k in ("sub_image", "patch_size", "scale_factor") if k in config}
        made = build_processor(**options, **splitting, **(processor or {}))
    elif family == "idefics2":  # the processor's placeholders per frame are the perceiver's latents
        hf = tiny_idefics2_model(seed=seed, attn_implementation=attn, **options, **config)
        latents = {"n_latents": config["n_latents"]} if "n_latents" in config else {}
        made = tiny_idefics2_processor(**options, **latents, **(processor or {}))
    elif family in ("glm4v", "glm4v_moe"):  # the processor patches and merges as the tower does
        build = tiny_glm4v_model if family == "glm4v" else tiny_glm4v_moe_model
        hf = build(seed=seed, attn_implementation=attn, **options, **config)
        patching = {k: config[k] for k in ("patch_size",) if k in config}
        made = tiny_glm4v_processor(**options, **patching, **(processor or {}))
    else:
        hf = tiny_hf_model(family, seed=seed, attn_implementation=attn, **options, **config)
        made = tiny_qwen_processor(**options, **(processor or {}))
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

"""Tiny random Qwen2-VL, Qwen2.5-VL and Qwen3-VL models with offline processors (the library's
`random-tiny` model is one of them: `vlens.zoo.random_tiny`)."""

from __future__ import annotations

from typing import Any

import torch
from transformers import (
    Qwen2_5_VLConfig,
    Qwen2_5_VLForConditionalGeneration,
    Qwen2VLConfig,
    Qwen2VLForConditionalGeneration,
    Qwen2VLImageProcessorPil,
    Qwen3VLConfig,
    Qwen3VLForConditionalGeneration,
)

from vlens.core.processors import SimpleVLProcessor
from vlens.testing.common import QWEN_CHAT_TEMPLATE, QWEN_SPECIAL_TOKENS, perturb_norms, word_level_tokenizer
from vlens.utils.errors import UserInputError


def qwen_image_processor(min_pixels: int = 56 * 56, max_pixels: int = 28 * 28 * 64, **kwargs: Any):
    return Qwen2VLImageProcessorPil(min_pixels=min_pixels, max_pixels=max_pixels, patch_size=14,
                                    merge_size=2, temporal_patch_size=2, **kwargs)


def tiny_qwen_processor(tokenizer=None, **image_kwargs: Any) -> SimpleVLProcessor:
    tokenizer = tokenizer or word_level_tokenizer()
    return SimpleVLProcessor(tokenizer, qwen_image_processor(**image_kwargs), chat_template=QWEN_CHAT_TEMPLATE)


def tiny_qwen_config(family: str = "qwen2_5_vl", vocab_size: int | None = None, n_layers: int = 2,
                     d_model: int = 64, n_heads: int = 4, n_kv_heads: int = 2, d_mlp: int = 96,
                     mrope_section: list[int] | None = None, vision_depth: int = 2, vision_width: int = 32,
                     tokenizer=None, **text_overrides: Any):
    """A tiny Qwen2-VL / Qwen2.5-VL config whose special-token ids match `word_level_tokenizer`."""
    tokenizer = tokenizer or word_level_tokenizer()
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in QWEN_SPECIAL_TOKENS}
    d_head = d_model // n_heads
    section = mrope_section or default_mrope_section(d_head)
    text = dict(vocab_size=vocab_size or len(tokenizer), hidden_size=d_model, intermediate_size=d_mlp,
                num_hidden_layers=n_layers, num_attention_heads=n_heads, num_key_value_heads=n_kv_heads,
                max_position_embeddings=2048, rms_norm_eps=1e-6, pad_token_id=ids["<|endoftext|>"],
                eos_token_id=ids["<|im_end|>"],
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": section})
    text.update(text_overrides)
    vision: dict[str, Any]
    cls: type[Qwen2VLConfig] | type[Qwen2_5_VLConfig]
    if family == "qwen2_vl":
        vision = dict(depth=vision_depth, embed_dim=vision_width, hidden_size=d_model, num_heads=2,
                      mlp_ratio=2, patch_size=14, spatial_merge_size=2, temporal_patch_size=2, in_channels=3)
        cls = Qwen2VLConfig
    elif family == "qwen2_5_vl":
        vision = dict(depth=vision_depth, hidden_size=vision_width, out_hidden_size=d_model, num_heads=2,
                      intermediate_size=2 * vision_width, patch_size=14, spatial_merge_size=2,
                      temporal_patch_size=2, window_size=56, fullatt_block_indexes=[vision_depth - 1],
                      in_channels=3)
        cls = Qwen2_5_VLConfig
    else:
        raise UserInputError(f"tiny_qwen_config: unknown family {family!r} (qwen2_vl or qwen2_5_vl).")
    return cls(text_config=text, vision_config=vision, image_token_id=ids["<|image_pad|>"],
               video_token_id=ids["<|video_pad|>"], vision_start_token_id=ids["<|vision_start|>"],
               vision_end_token_id=ids["<|vision_end|>"], tie_word_embeddings=False)


def default_mrope_section(d_head: int) -> list[int]:
    half = d_head // 2
    t = half // 4
    h = (half - t) // 2
    return [t, h, half - t - h]


def tiny_hf_model(family: str = "qwen2_5_vl", seed: int = 0, attn_implementation: str = "eager",
                  dtype: torch.dtype = torch.float32, **config_kwargs: Any):
    """A randomly initialised tiny HF model (eval mode) of the given family."""
    config = tiny_qwen_config(family, **config_kwargs)
    config._attn_implementation = attn_implementation
    cls = {"qwen2_vl": Qwen2VLForConditionalGeneration,
           "qwen2_5_vl": Qwen2_5_VLForConditionalGeneration}[family]
    torch.manual_seed(seed)
    model = cls(config).to(dtype).eval()
    perturb_norms(model, seed)
    return model



# ---------------------------------------------------------------- Qwen3-VL


def qwen3_vl_image_processor(min_pixels: int = 64 * 64, max_pixels: int = 32 * 32 * 16, **kwargs: Any):
    """Qwen3-VL's image processor: Qwen2-VL's with 16 px patches (32 px per merged token)."""
    return Qwen2VLImageProcessorPil(min_pixels=min_pixels, max_pixels=max_pixels, patch_size=16,
                                    merge_size=2, temporal_patch_size=2, **kwargs)


def tiny_qwen3_vl_processor(tokenizer=None, **image_kwargs: Any) -> SimpleVLProcessor:
    """Offline processor for `tiny_qwen3_vl_model` (same chat format and tokens as Qwen2-VL)."""
    tokenizer = tokenizer or word_level_tokenizer()
    return SimpleVLProcessor(tokenizer, qwen3_vl_image_processor(**image_kwargs), chat_template=QWEN_CHAT_TEMPLATE)


def tiny_qwen3_vl_config(vocab_size: int | None = None, n_layers: int = 3, d_model: int = 64, n_heads: int = 4,
                         n_kv_heads: int = 2, d_head: int = 24, d_mlp: int = 96, mrope_section: list[int] | None = None,
                         attention_bias: bool = False, deepstack_visual_indexes: list[int] | None = None,
                         vision_depth: int = 3, vision_width: int = 32, vision_heads: int = 2,
                         num_position_embeddings: int = 16, tokenizer=None, **text_overrides: Any):
    """A tiny dense Qwen3-VL config (16 px patches) whose special-token ids match `word_level_tokenizer`.

    d_head is independent of d_model / n_heads, as in Qwen3. DeepStack defaults to vision blocks
    [0, 1] feeding decoder layers 0 and 1.
    """
    tokenizer = tokenizer or word_level_tokenizer()
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in QWEN_SPECIAL_TOKENS}
    section = mrope_section or default_mrope_section(d_head)
    text = dict(vocab_size=vocab_size or len(tokenizer), hidden_size=d_model, intermediate_size=d_mlp,
                num_hidden_layers=n_layers, num_attention_heads=n_heads, num_key_value_heads=n_kv_heads,
                head_dim=d_head, max_position_embeddings=2048, rms_norm_eps=1e-6, attention_bias=attention_bias,
                pad_token_id=ids["<|endoftext|>"],
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": section,
                                 "mrope_interleaved": True})
    text.update(text_overrides)
    deepstack = [0, 1] if deepstack_visual_indexes is None else list(deepstack_visual_indexes)
    vision = dict(depth=vision_depth, hidden_size=vision_width, intermediate_size=2 * vision_width,
                  num_heads=vision_heads, patch_size=16, spatial_merge_size=2, temporal_patch_size=2,
                  out_hidden_size=d_model, num_position_embeddings=num_position_embeddings,
                  deepstack_visual_indexes=deepstack, in_channels=3)
    return Qwen3VLConfig(text_config=text, vision_config=vision, image_token_id=ids["<|image_pad|>"],
                         video_token_id=ids["<|video_pad|>"], vision_start_token_id=ids["<|vision_start|>"],
                         vision_end_token_id=ids["<|vision_end|>"], tie_word_embeddings=False)


def tiny_qwen3_vl_model(seed: int = 0, attn_implementation: str = "eager", dtype: torch.dtype = torch.float32,
                        **config_kwargs: Any):
    """A randomly initialised tiny `Qwen3VLForConditionalGeneration` (eval mode, norms perturbed)."""
    config = tiny_qwen3_vl_config(**config_kwargs)
    config._attn_implementation = attn_implementation
    torch.manual_seed(seed)
    # HF wraps Module.to with functools.wraps: mypy reads the unbound signature (self first)
    model = Qwen3VLForConditionalGeneration(config).to(dtype).eval()  # type: ignore[arg-type]
    model.generation_config.eos_token_id = word_level_tokenizer().convert_tokens_to_ids("<|im_end|>")
    perturb_norms(model, seed)
    return model

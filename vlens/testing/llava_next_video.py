"""Tiny random LLaVA-NeXT-Video models with an offline processor (HF's processor class without its
torchvision video processor, `LlavaNextVideoImageTextProcessor`, and the PIL anyres image processor)."""

from __future__ import annotations

from typing import Any, Literal

import torch
from transformers import (
    LlavaNextImageProcessorPil,
    LlavaNextVideoConfig,
    LlavaNextVideoForConditionalGeneration,
    PreTrainedTokenizerFast,
)

from vlens.core.architectures.llava_next_video import LlavaNextVideoImageTextProcessor
from vlens.testing.common import TEST_WORDS, word_level_tokenizer
from vlens.testing.llava_next import build_random_model, default_pinpoints, tiny_llava_next_config

LLAVA_NEXT_VIDEO_SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<pad>", "<image>", "<video>"]
# llava-next-video-hf's Vicuna-style format: "USER: <image>\n<video>\n{question} ASSISTANT:"
LLAVA_NEXT_VIDEO_CHAT_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] == 'user' %}USER: "
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for item in message['content'] %}{% if item['type'] == 'image' %}<image>\n"
    "{% elif item['type'] == 'video' %}<video>\n"
    "{% elif item['type'] == 'text' %}{{ item['text'] }}{% endif %}{% endfor %}{% endif %}"
    "{% else %} ASSISTANT: {{ message['content'] }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %} ASSISTANT:{% endif %}"
)


def llava_next_video_tokenizer() -> PreTrainedTokenizerFast:
    """An offline word-level tokenizer with LLaVA-NeXT-Video's specials (<image>, <video>, </s> as EOS)."""
    tokenizer = word_level_tokenizer(words=[*TEST_WORDS, "USER", "ASSISTANT", ":"],
                                     specials=LLAVA_NEXT_VIDEO_SPECIAL_TOKENS, pad_token="<pad>", eos_token="</s>")
    tokenizer.chat_template = LLAVA_NEXT_VIDEO_CHAT_TEMPLATE
    return tokenizer


def tiny_llava_next_video_processor(tile: int = 32, patch_size: int = 8, pinpoints: list | None = None,
                                    strategy: str = "default", cls_token: bool = True,
                                    tokenizer=None) -> LlavaNextVideoImageTextProcessor:
    """The image-and-text LLaVA-NeXT-Video processor (`tile`: the tower's side; `cls_token`: a CLIP tower)."""
    image_processor = LlavaNextImageProcessorPil(size={"shortest_edge": tile}, crop_size={"height": tile, "width": tile},
                                                 image_grid_pinpoints=pinpoints or default_pinpoints(tile))
    return LlavaNextVideoImageTextProcessor(image_processor=image_processor,
                                            tokenizer=tokenizer or llava_next_video_tokenizer(),
                                            patch_size=patch_size, vision_feature_select_strategy=strategy,
                                            num_additional_image_tokens=1 if cls_token else 0,
                                            chat_template=LLAVA_NEXT_VIDEO_CHAT_TEMPLATE)


def tiny_llava_next_video_config(n_layers: int = 2, d_model: int = 64, n_heads: int = 4, n_kv_heads: int = 2,
                                 d_mlp: int = 96, tile: int = 32, patch_size: int = 8, pinpoints: list | None = None,
                                 vision_feature_layer: int | list[int] = -2,
                                 vision_feature_select_strategy: Literal["default", "full"] = "default",
                                 spatial_pool_mode: str = "average", tower: str = "clip", text_model: str = "llama",
                                 vision_depth: int = 3, vision_width: int = 32, vision_heads: int = 2,
                                 tokenizer=None, **text_overrides: Any) -> LlavaNextVideoConfig:
    """A tiny LLaVA-NeXT-Video config whose token ids match `llava_next_video_tokenizer` (pool stride 2)."""
    tokenizer = tokenizer or llava_next_video_tokenizer()
    extra = dict(video_token_index=tokenizer.convert_tokens_to_ids("<video>"), spatial_pool_mode=spatial_pool_mode,
                 spatial_pool_stride=2)
    return tiny_llava_next_config(n_layers, d_model, n_heads, n_kv_heads, d_mlp, tile, patch_size, pinpoints,
                                  vision_feature_layer, vision_feature_select_strategy, tower, text_model, vision_depth,
                                  vision_width, vision_heads, tokenizer, config_class=LlavaNextVideoConfig, extra=extra,
                                  **text_overrides)


def tiny_llava_next_video_model(seed: int = 0, attn_implementation: str = "eager", dtype: torch.dtype = torch.float32,
                                **config_kwargs: Any) -> LlavaNextVideoForConditionalGeneration:
    """A randomly initialised tiny `LlavaNextVideoForConditionalGeneration` (eval mode, norms perturbed)."""
    return build_random_model(LlavaNextVideoForConditionalGeneration, tiny_llava_next_video_config(**config_kwargs), seed,
                  attn_implementation, dtype)

"""Tiny random LLaVA-NeXT and LLaVA-OneVision models with HF's own processors, offline.

LLaVA-NeXT: Llama (or Mistral / Qwen2) text model, CLIP (or SigLIP) tower, `LlavaNextProcessor`
with the PIL `LlavaNextImageProcessorPil`, the llava-v1.6-mistral prompt (`[INST] <image>\\n...
[/INST]`). LLaVA-OneVision: Qwen2 text model, SigLIP tower, HF's `LlavaOnevisionProcessor`
without its video processor (`LlavaOnevisionImageTextProcessor`, no torchvision) with the PIL
`LlavaOnevisionImageProcessorPil`, the llava-hf chat template. Tile sides, patch sizes and
pinpoints are parameters, so tests can pick sizes unlike the released ones.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from transformers import (
    LlavaNextConfig,
    LlavaNextForConditionalGeneration,
    LlavaNextImageProcessorPil,
    LlavaNextProcessor,
    LlavaOnevisionConfig,
    LlavaOnevisionForConditionalGeneration,
    LlavaOnevisionImageProcessorPil,
    PreTrainedTokenizerFast,
)

from vlens.core.architectures.llava_onevision import LlavaOnevisionImageTextProcessor
from vlens.testing.common import TEST_WORDS, perturb_norms, word_level_tokenizer
from vlens.utils.errors import UserInputError

LLAVA_NEXT_SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<pad>", "<image>"]
LLAVA_NEXT_WORDS = [*TEST_WORDS, "INST", "[", "]", "/"]
# llava-v1.6-mistral's format: "[INST] <image>\n{question} [/INST]"
LLAVA_NEXT_CHAT_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] == 'user' %}[INST] "
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for item in message['content'] %}{% if item['type'] == 'image' %}<image>\n"
    "{% elif item['type'] == 'text' %}{{ item['text'] }}{% endif %}{% endfor %}{% endif %} [/INST]"
    "{% else %} {% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for item in message['content'] %}{{ item['text'] }}{% endfor %}{% endif %}{{ eos_token }}{% endif %}"
    "{% endfor %}"
)

LLAVA_ONEVISION_SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<image>", "<video>"]
# llava-hf/llava-onevision-qwen2-*-ov-hf: images first, then "\n" + text, turns closed by <|im_end|>
LLAVA_ONEVISION_CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + ' ' }}"
    "{% if message['content'] is string %}{{ '\n' + message['content'] }}{% else %}"
    "{% for item in message['content'] %}{% if item['type'] == 'image' %}{{ '<image>' }}{% endif %}{% endfor %}"
    "{% for item in message['content'] %}{% if item['type'] == 'video' %}{{ '<video>' }}{% endif %}{% endfor %}"
    "{% for item in message['content'] %}{% if item['type'] == 'text' %}{{ '\n' + item['text'] }}{% endif %}"
    "{% endfor %}{% endif %}{{ '<|im_end|>' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def default_pinpoints(tile: int, max_tiles: int = 3) -> list[list[int]]:
    """Every (rows x cols) tile layout with rows, cols <= max_tiles, as (height, width) pixels."""
    return [[r * tile, c * tile] for r in range(1, max_tiles + 1) for c in range(1, max_tiles + 1)]


# ---------------------------------------------------------------------------------------- LLaVA-NeXT
def llava_next_tokenizer() -> PreTrainedTokenizerFast:
    """An offline word-level tokenizer with LLaVA-NeXT's specials (<image>, </s> as EOS) and chat template."""
    tokenizer = word_level_tokenizer(words=LLAVA_NEXT_WORDS, specials=LLAVA_NEXT_SPECIAL_TOKENS, pad_token="<pad>",
                                     eos_token="</s>")
    tokenizer.chat_template = LLAVA_NEXT_CHAT_TEMPLATE
    return tokenizer


def tiny_llava_next_processor(tile: int = 32, patch_size: int = 8, pinpoints: list | None = None,
                              strategy: str = "default", cls_token: bool = True, tokenizer=None) -> LlavaNextProcessor:
    """HF's `LlavaNextProcessor` around the offline tokenizer and the PIL anyres image processor.

    tile: the tower's input side (each tile's side in px); cls_token: whether the tower has one
    (CLIP yes, SigLIP no: `num_additional_image_tokens`).
    """
    image_processor = LlavaNextImageProcessorPil(size={"shortest_edge": tile}, crop_size={"height": tile, "width": tile},
                                                 image_grid_pinpoints=pinpoints or default_pinpoints(tile))
    return LlavaNextProcessor(image_processor=image_processor, tokenizer=tokenizer or llava_next_tokenizer(),
                              patch_size=patch_size, vision_feature_select_strategy=strategy,
                              num_additional_image_tokens=1 if cls_token else 0,
                              chat_template=LLAVA_NEXT_CHAT_TEMPLATE)


def _vision_config(tower: str, tile: int, patch_size: int, depth: int, width: int, heads: int) -> dict:
    if tower == "clip":
        return dict(model_type="clip_vision_model", hidden_size=width, intermediate_size=2 * width,
                    num_hidden_layers=depth, num_attention_heads=heads, image_size=tile, patch_size=patch_size,
                    projection_dim=width)
    if tower == "siglip":
        return dict(model_type="siglip_vision_model", hidden_size=width, intermediate_size=2 * width,
                    num_hidden_layers=depth, num_attention_heads=heads, image_size=tile, patch_size=patch_size,
                    vision_use_head=False)
    raise UserInputError(f"tower must be 'clip' or 'siglip', got {tower!r}")


def _text_config(text_model: str, tokenizer, n_layers: int, d_model: int, n_heads: int, n_kv_heads: int,
                 d_mlp: int, **overrides: Any) -> dict:
    text = dict(model_type=text_model, vocab_size=len(tokenizer), hidden_size=d_model, intermediate_size=d_mlp,
                num_hidden_layers=n_layers, num_attention_heads=n_heads, num_key_value_heads=n_kv_heads,
                max_position_embeddings=1024, rms_norm_eps=1e-5, pad_token_id=tokenizer.pad_token_id,
                eos_token_id=tokenizer.eos_token_id)
    text.update(overrides)
    return text


def tiny_llava_next_config(n_layers: int = 2, d_model: int = 64, n_heads: int = 4, n_kv_heads: int = 2,
                           d_mlp: int = 96, tile: int = 32, patch_size: int = 8, pinpoints: list | None = None,
                           vision_feature_layer: int | list[int] = -2,
                           vision_feature_select_strategy: Literal["default", "full"] = "default",
                           tower: str = "clip", text_model: str = "llama", vision_depth: int = 3,
                           vision_width: int = 32, vision_heads: int = 2, tokenizer=None,
                           config_class: type = LlavaNextConfig, extra: dict | None = None, **text_overrides: Any):
    """A tiny LLaVA-NeXT config whose token ids match `llava_next_tokenizer` (`config_class` with the
    `extra` fields: a LLaVA-NeXT-Video config)."""
    tokenizer = tokenizer or llava_next_tokenizer()
    text = _text_config(text_model, tokenizer, n_layers, d_model, n_heads, n_kv_heads, d_mlp,
                        bos_token_id=tokenizer.convert_tokens_to_ids("<s>"), **text_overrides)
    return config_class(text_config=text, **(extra or {}),
                           vision_config=_vision_config(tower, tile, patch_size, vision_depth, vision_width,
                                                        vision_heads),
                           image_token_index=tokenizer.convert_tokens_to_ids("<image>"),
                           image_grid_pinpoints=pinpoints or default_pinpoints(tile),
                           vision_feature_layer=vision_feature_layer,
                           vision_feature_select_strategy=vision_feature_select_strategy, tie_word_embeddings=False)


def build_random_model(model_class, config, seed: int, attn_implementation: str, dtype: torch.dtype):
    """`model_class(config)` with a fixed seed, in `dtype`, eval mode, norms and biases perturbed."""
    config._attn_implementation = attn_implementation
    torch.manual_seed(seed)
    # HF wraps Module.to with functools.wraps: mypy reads the unbound signature (self first)
    model = model_class(config).to(dtype).eval()
    perturb_norms(model, seed)
    return model


def tiny_llava_next_model(seed: int = 0, attn_implementation: str = "eager", dtype: torch.dtype = torch.float32,
                          **config_kwargs: Any) -> LlavaNextForConditionalGeneration:
    """A randomly initialised tiny `LlavaNextForConditionalGeneration` (eval mode, norms and biases perturbed)."""
    return build_random_model(LlavaNextForConditionalGeneration, tiny_llava_next_config(**config_kwargs), seed,
                  attn_implementation, dtype)


# ----------------------------------------------------------------------------------- LLaVA-OneVision
def llava_onevision_tokenizer() -> PreTrainedTokenizerFast:
    """An offline word-level tokenizer with OneVision's specials (<image>, <video>, <|im_end|> as EOS)."""
    tokenizer = word_level_tokenizer(words=list(TEST_WORDS), specials=LLAVA_ONEVISION_SPECIAL_TOKENS,
                                     pad_token="<|endoftext|>", eos_token="<|im_end|>")
    tokenizer.chat_template = LLAVA_ONEVISION_CHAT_TEMPLATE
    return tokenizer


def tiny_llava_onevision_processor(tile: int = 32, patch_size: int = 8, pinpoints: list | None = None,
                                   vision_aspect_ratio: str = "anyres_max_4", strategy: str = "full",
                                   cls_token: bool = False, tokenizer=None) -> LlavaOnevisionImageTextProcessor:
    """HF's OneVision processor (image-only: no torchvision) with the PIL anyres image processor.

    num_image_tokens: the tower's tokens per tile, (tile // patch_size) ** 2, + 1 with a CLS token
    (cls_token: a CLIP tower; the processor drops one again for strategy "default").
    """
    image_processor = LlavaOnevisionImageProcessorPil(size={"height": tile, "width": tile},
                                                      image_grid_pinpoints=pinpoints or default_pinpoints(tile))
    return LlavaOnevisionImageTextProcessor(image_processor=image_processor,
                                        tokenizer=tokenizer or llava_onevision_tokenizer(),
                                        num_image_tokens=(tile // patch_size) ** 2 + int(cls_token),
                                        vision_feature_select_strategy=strategy,
                                        vision_aspect_ratio=vision_aspect_ratio,
                                        chat_template=LLAVA_ONEVISION_CHAT_TEMPLATE)


def tiny_llava_onevision_config(n_layers: int = 2, d_model: int = 64, n_heads: int = 4, n_kv_heads: int = 2,
                                d_mlp: int = 96, tile: int = 32, patch_size: int = 8, pinpoints: list | None = None,
                                vision_aspect_ratio: str = "anyres_max_4", vision_feature_layer: int | list[int] = -1,
                                vision_feature_select_strategy: Literal["default", "full"] = "full",
                                tower: str = "siglip",
                                text_model: str = "qwen2", vision_depth: int = 3, vision_width: int = 32,
                                vision_heads: int = 2, tokenizer=None, **text_overrides: Any):
    """A tiny LLaVA-OneVision config whose token ids match `llava_onevision_tokenizer`."""
    tokenizer = tokenizer or llava_onevision_tokenizer()
    text = _text_config(text_model, tokenizer, n_layers, d_model, n_heads, n_kv_heads, d_mlp, **text_overrides)
    return LlavaOnevisionConfig(text_config=text,
                                vision_config=_vision_config(tower, tile, patch_size, vision_depth, vision_width,
                                                             vision_heads),
                                image_token_index=tokenizer.convert_tokens_to_ids("<image>"),
                                video_token_index=tokenizer.convert_tokens_to_ids("<video>"),
                                image_grid_pinpoints=pinpoints or default_pinpoints(tile),
                                vision_aspect_ratio=vision_aspect_ratio, vision_feature_layer=vision_feature_layer,
                                vision_feature_select_strategy=vision_feature_select_strategy,
                                tie_word_embeddings=False)


def tiny_llava_onevision_model(seed: int = 0, attn_implementation: str = "eager", dtype: torch.dtype = torch.float32,
                               **config_kwargs: Any) -> LlavaOnevisionForConditionalGeneration:
    """A randomly initialised tiny `LlavaOnevisionForConditionalGeneration` (eval mode, norms perturbed)."""
    return build_random_model(LlavaOnevisionForConditionalGeneration, tiny_llava_onevision_config(**config_kwargs), seed,
                  attn_implementation, dtype)

"""A tiny random LLaVA-1.5 (Llama decoder, CLIP tower) with HF's own `LlavaProcessor`, offline."""

from __future__ import annotations

from typing import Any, Literal

import torch
from transformers import (
    CLIPImageProcessorPil,
    LlavaConfig,
    LlavaForConditionalGeneration,
    LlavaProcessor,
    PreTrainedTokenizerFast,
)

from vlens.testing.common import TEST_WORDS, perturb_norms, word_level_tokenizer

LLAVA_SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<pad>", "<image>"]
LLAVA_WORDS = [*TEST_WORDS, "USER", "ASSISTANT", ":"]

# LLaVA-1.5's chat format (llava-hf): "USER: <image>\n{question} ASSISTANT:"
LLAVA_CHAT_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] == 'user' %}USER: {% else %}ASSISTANT: {% endif %}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for item in message['content'] %}{% if item['type'] == 'image' %}<image>\n"
    "{% elif item['type'] == 'text' %}{{ item['text'] }}{% endif %}{% endfor %}{% endif %}"
    "{% if message['role'] == 'user' %} {% else %}{{ eos_token }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}ASSISTANT:{% endif %}"
)


def llava_tokenizer() -> PreTrainedTokenizerFast:
    """An offline word-level tokenizer with LLaVA's specials (<image>, </s> as EOS) and chat template."""
    tokenizer = word_level_tokenizer(words=LLAVA_WORDS, specials=LLAVA_SPECIAL_TOKENS, pad_token="<pad>",
                                     eos_token="</s>")
    tokenizer.chat_template = LLAVA_CHAT_TEMPLATE
    return tokenizer


def tiny_llava_processor(image_size: int = 32, patch_size: int = 8, strategy: str = "default", tokenizer=None):
    """HF's `LlavaProcessor` around the offline tokenizer and CLIP's PIL image processor.

    Each `<image>` expands to (image_size // patch_size)**2 tokens (+1 with strategy "full").
    """
    image_processor = CLIPImageProcessorPil(size={"shortest_edge": image_size},
                                            crop_size={"height": image_size, "width": image_size})
    return LlavaProcessor(image_processor=image_processor, tokenizer=tokenizer or llava_tokenizer(),
                          patch_size=patch_size, vision_feature_select_strategy=strategy,
                          num_additional_image_tokens=1, chat_template=LLAVA_CHAT_TEMPLATE)


def tiny_llava_config(vocab_size: int | None = None, n_layers: int = 2, d_model: int = 64, n_heads: int = 4,
                      n_kv_heads: int = 2, d_mlp: int = 96, vision_feature_layer: int | list[int] = -2,
                      vision_feature_select_strategy: Literal["default", "full"] = "default", image_size: int = 32, patch_size: int = 8,
                      vision_depth: int = 3, vision_width: int = 32, vision_heads: int = 2, tokenizer=None,
                      **text_overrides: Any):
    """A tiny LLaVA-1.5 config (Llama text model, CLIP tower) whose token ids match `llava_tokenizer`."""
    tokenizer = tokenizer or llava_tokenizer()
    text = dict(model_type="llama", vocab_size=vocab_size or len(tokenizer), hidden_size=d_model,
                intermediate_size=d_mlp, num_hidden_layers=n_layers, num_attention_heads=n_heads,
                num_key_value_heads=n_kv_heads, max_position_embeddings=512, rms_norm_eps=1e-5,
                pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                bos_token_id=tokenizer.convert_tokens_to_ids("<s>"))
    text.update(text_overrides)
    vision = dict(model_type="clip_vision_model", hidden_size=vision_width, intermediate_size=2 * vision_width,
                  num_hidden_layers=vision_depth, num_attention_heads=vision_heads, image_size=image_size,
                  patch_size=patch_size, projection_dim=vision_width)
    return LlavaConfig(text_config=text, vision_config=vision,
                       image_token_index=tokenizer.convert_tokens_to_ids("<image>"),
                       vision_feature_layer=vision_feature_layer,
                       vision_feature_select_strategy=vision_feature_select_strategy, tie_word_embeddings=False)


def tiny_llava_model(seed: int = 0, attn_implementation: str = "eager", dtype: torch.dtype = torch.float32,
                     **config_kwargs: Any):
    """A randomly initialised tiny `LlavaForConditionalGeneration` (eval mode, norms and biases perturbed)."""
    config = tiny_llava_config(**config_kwargs)
    config._attn_implementation = attn_implementation
    torch.manual_seed(seed)
    # HF wraps Module.to with functools.wraps: mypy reads the unbound signature (self first)
    model = LlavaForConditionalGeneration(config).to(dtype).eval()  # type: ignore[arg-type]
    perturb_norms(model, seed)
    return model

"""Tiny random models, tokenizers and processors built offline, for tests, benchmarks and docs.

The tiny Qwen2-VL / Qwen2.5-VL builders come from `vlens.zoo.random_tiny` (the library's
`random-tiny` model) and are re-exported here; the Qwen3-VL and LLaVA ones live here. Nothing
here downloads anything: configs come from HF config classes, the tokenizer from `tokenizers`,
the image processor from its parameters (PIL backend, no torchvision).
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
import torch
from PIL import Image
from transformers import (
    CLIPImageProcessorPil,
    LlavaConfig,
    LlavaForConditionalGeneration,
    LlavaProcessor,
    PreTrainedTokenizerFast,
    Qwen2VLImageProcessorPil,
    Qwen3VLConfig,
    Qwen3VLForConditionalGeneration,
)

from vlens.processors import SimpleVLProcessor

# the tiny Qwen2-VL / Qwen2.5-VL builders live in the library: `--model random-tiny` is one of them
from vlens.zoo.random_tiny import (  # noqa: F401  (re-exported for tests)
    QWEN_CHAT_TEMPLATE,
    QWEN_SPECIAL_TOKENS,
    default_mrope_section,
    perturb_norms,
    qwen_image_processor,
    tiny_hf_model,
    tiny_qwen_config,
    tiny_qwen_processor,
    word_level_tokenizer,
)
from vlens.zoo.random_tiny import TINY_WORDS as TEST_WORDS


def random_image(width: int = 56, height: int = 56, seed: int = 0):
    """A random RGB PIL image (deterministic in seed)."""
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, size=(height, width, 3), dtype=np.uint8))


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


# ---------------------------------------------------------------- LLaVA-1.5

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

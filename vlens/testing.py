"""Tiny random models, tokenizers and processors built offline, for tests, benchmarks and docs.

Nothing here downloads anything: configs come from HF config classes, the tokenizer from
`tokenizers`, the image processor from its parameters (PIL backend, no torchvision).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from PIL import Image
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import (
    CLIPImageProcessorPil,
    LlavaConfig,
    LlavaForConditionalGeneration,
    LlavaProcessor,
    PreTrainedTokenizerFast,
    Qwen2_5_VLConfig,
    Qwen2_5_VLForConditionalGeneration,
    Qwen2VLConfig,
    Qwen2VLForConditionalGeneration,
    Qwen2VLImageProcessorPil,
    Qwen3VLConfig,
    Qwen3VLForConditionalGeneration,
)

from vlens.processors import SimpleVLProcessor

QWEN_SPECIAL_TOKENS = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>",
    "<|image_pad|>", "<|video_pad|>",
]
TEST_WORDS = (
    "system user assistant You are a helpful . How many dots objects are there is the what colour shape "
    "red blue green yes no left of right ? , 0 1 2 3 4 5 6 7 8 9 10"
).split()

# Qwen2-VL's chat format (without the default system message), for tiny test processors.
QWEN_CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for item in message['content'] %}"
    "{% if item['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif item['type'] == 'text' %}{{ item['text'] }}{% endif %}{% endfor %}{% endif %}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def word_level_tokenizer(words: list[str] = TEST_WORDS, specials: list[str] = QWEN_SPECIAL_TOKENS,
                         pad_token: str = "<|endoftext|>", eos_token: str = "<|im_end|>",
                         extra_vocab: int = 0) -> PreTrainedTokenizerFast:
    """An offline word-level tokenizer: specials first, then words, newline kept as a token."""
    vocab: dict[str, int] = {}
    for token in [*specials, "[UNK]", "\n", *words]:
        vocab.setdefault(token, len(vocab))
    for i in range(extra_vocab):
        vocab.setdefault(f"<extra_{i}>", len(vocab))
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split("\n", "isolated"),
        pre_tokenizers.WhitespaceSplit(),
        pre_tokenizers.Punctuation(),
    ])
    backend.add_special_tokens(specials)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]", pad_token=pad_token,
                                        eos_token=eos_token)
    tokenizer.chat_template = QWEN_CHAT_TEMPLATE
    return tokenizer


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
    section = mrope_section or _default_mrope_section(d_head)
    text = dict(vocab_size=vocab_size or len(tokenizer), hidden_size=d_model, intermediate_size=d_mlp,
                num_hidden_layers=n_layers, num_attention_heads=n_heads, num_key_value_heads=n_kv_heads,
                max_position_embeddings=2048, rms_norm_eps=1e-6, pad_token_id=ids["<|endoftext|>"],
                eos_token_id=ids["<|im_end|>"],
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": section})
    text.update(text_overrides)
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
        raise ValueError(f"tiny_qwen_config: unknown family {family!r} (qwen2_vl or qwen2_5_vl).")
    return cls(text_config=text, vision_config=vision, image_token_id=ids["<|image_pad|>"],
               video_token_id=ids["<|video_pad|>"], vision_start_token_id=ids["<|vision_start|>"],
               vision_end_token_id=ids["<|vision_end|>"], tie_word_embeddings=False)


def _default_mrope_section(d_head: int) -> list[int]:
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
    _perturb_norms(model, seed)
    return model


def _perturb_norms(model: torch.nn.Module, seed: int) -> None:
    """Random init leaves norm weights at 1 and biases at 0; perturb them so parity tests see them."""
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight") or "layernorm" in name or name.endswith("ln_q.weight"):
                param.add_(0.1 * torch.randn(param.shape, generator=generator).to(param.dtype))
            elif name.endswith(".bias"):
                param.add_(0.05 * torch.randn(param.shape, generator=generator).to(param.dtype))


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
    section = mrope_section or _default_mrope_section(d_head)
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
    model = Qwen3VLForConditionalGeneration(config).to(dtype).eval()
    model.generation_config.eos_token_id = word_level_tokenizer().convert_tokens_to_ids("<|im_end|>")
    _perturb_norms(model, seed)
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
                      vision_feature_select_strategy: str = "default", image_size: int = 32, patch_size: int = 8,
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
    model = LlavaForConditionalGeneration(config).to(dtype).eval()
    _perturb_norms(model, seed)
    return model

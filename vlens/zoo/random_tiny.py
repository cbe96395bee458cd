"""`random-tiny`: a randomly initialised tiny Qwen2.5-VL, built offline, for plumbing.

`random_tiny_model()` is what `--model random-tiny` (and `vlens.load_model("random-tiny")`) loads:
2 decoder layers of width 64 with 4 heads (2 key/value heads), a 2-block vision tower, a 48-token
word-level tokenizer with Qwen's special tokens and chat format, and Qwen's PIL image processor
(56*56 to 28*28*64 pixels). Its weights are random (seed 0) with perturbed norms and biases, so
every path through the model is exercised; its answers mean nothing. The builders below are
also the test suite's tiny Qwen models (`vlens.testing` re-exports them). Nothing is downloaded.
"""

from __future__ import annotations

from typing import Any

import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import (
    PreTrainedTokenizerFast,
    Qwen2_5_VLConfig,
    Qwen2_5_VLForConditionalGeneration,
    Qwen2VLConfig,
    Qwen2VLForConditionalGeneration,
    Qwen2VLImageProcessorPil,
)

from vlens.model import HookedVLM
from vlens.processors import SimpleVLProcessor

QWEN_SPECIAL_TOKENS = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>",
    "<|image_pad|>", "<|video_pad|>",
]
TINY_WORDS = (
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


def word_level_tokenizer(words: list[str] = TINY_WORDS, specials: list[str] = QWEN_SPECIAL_TOKENS,
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
        raise ValueError(f"tiny_qwen_config: unknown family {family!r} (qwen2_vl or qwen2_5_vl).")
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


def perturb_norms(model: torch.nn.Module, seed: int) -> None:
    """Random init leaves norm weights at 1 and biases at 0; perturb them so parity tests see them."""
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight") or "layernorm" in name or name.endswith("ln_q.weight"):
                param.add_(0.1 * torch.randn(param.shape, generator=generator).to(param.dtype))
            elif name.endswith(".bias"):
                param.add_(0.05 * torch.randn(param.shape, generator=generator).to(param.dtype))


def random_tiny_model(seed: int = 0, family: str = "qwen2_5_vl"):
    """The `random-tiny` model: `tiny_hf_model(family, seed)` with `tiny_qwen_processor()`, as a HookedVLM."""
    return HookedVLM.from_hf(tiny_hf_model(family, seed=seed), tiny_qwen_processor())

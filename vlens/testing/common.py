"""What every family's tiny test model shares: an offline word-level tokenizer (Qwen's special
tokens and chat format by default), a random image, and norm/bias perturbation so parity tests see
every parameter. Nothing is downloaded."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from PIL import Image
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

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
    "{% elif item['type'] == 'video' %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif item['type'] == 'text' %}{{ item['text'] }}{% endif %}{% endfor %}{% endif %}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def word_level_tokenizer(words: list[str] = TINY_WORDS, specials: list[str] = QWEN_SPECIAL_TOKENS,
                         pad_token: str = "<|endoftext|>", eos_token: str = "<|im_end|>",
                         extra_vocab: int = 0, extra_special_tokens: dict[str, str] | None = None,
                         bos_token: str | None = None, keep_newlines: bool = False) -> PreTrainedTokenizerFast:
    """An offline word-level tokenizer: specials first, then words (and a newline token).

    extra_special_tokens: named special tokens the family's processor reads from the tokenizer
    (InternVL's ``start_image_token``, ...), saved and loaded with it. keep_newlines: every "\n" is a
    token of its own (as in real tokenizers); by default whitespace, newlines included, only splits."""
    vocab: dict[str, int] = {}
    for token in [*specials, "[UNK]", "\n", *words]:
        vocab.setdefault(token, len(vocab))
    for i in range(extra_vocab):
        vocab.setdefault(f"<extra_{i}>", len(vocab))
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split("\n", "isolated"),
        pre_tokenizers.Split(" ", "removed") if keep_newlines else pre_tokenizers.WhitespaceSplit(),
        pre_tokenizers.Punctuation(),
    ])
    backend.add_special_tokens(specials)
    named: dict[str, Any] = {"extra_special_tokens": extra_special_tokens} if extra_special_tokens else {}
    if bos_token is not None:
        named["bos_token"] = bos_token
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]", pad_token=pad_token,
                                        eos_token=eos_token, **named)
    tokenizer.chat_template = QWEN_CHAT_TEMPLATE
    return tokenizer


def perturb_norms(model: torch.nn.Module, seed: int) -> None:
    """Random init leaves norm weights at 1 and biases at 0; perturb them so parity tests see them."""
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight") or "layernorm" in name or name.endswith("ln_q.weight"):
                param.add_(0.1 * torch.randn(param.shape, generator=generator).to(param.dtype))
            elif name.endswith(".bias"):
                param.add_(0.05 * torch.randn(param.shape, generator=generator).to(param.dtype))



def finish_tiny_model(model, seed: int):
    """Eval mode, the chat format's EOS (<|im_end|>) for generation, perturbed norms; returns the model."""
    model.eval()
    model.generation_config.eos_token_id = word_level_tokenizer().convert_tokens_to_ids("<|im_end|>")
    perturb_norms(model, seed)
    return model


def random_image(width: int = 56, height: int = 56, seed: int = 0):
    """A random RGB PIL image (deterministic in seed)."""
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, size=(height, width, 3), dtype=np.uint8))

TEST_WORDS = TINY_WORDS

"""A tiny random PaliGemma (`PaliGemmaForConditionalGeneration`: SigLIP tower, linear projector, Gemma or
Gemma 2 decoder, the prompt as a bidirectional prefix) with HF's own `PaliGemmaProcessor`, built offline.

The tokenizer is word-level with PaliGemma's special tokens (`<pad>`, `<eos>`, `<bos>`, `<unk>`, `<image>`;
no BOS added by the tokenizer: the processor writes it after the image tokens) and the processor adds its
1024 `<locNNNN>` and 128 `<segNNN>` tokens, so the model's vocabulary is `len(tokenizer)` after that. The
image processor is SigLIP's PIL one (a fixed square resize, no crop).
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import (
    PaliGemmaConfig,
    PaliGemmaForConditionalGeneration,
    PaliGemmaProcessor,
    PreTrainedTokenizerFast,
    SiglipImageProcessorPil,
)

from vlens.testing.common import TEST_WORDS, perturb_norms
from vlens.testing.gemma3 import gemma_word_tokenizer

PALIGEMMA_SPECIAL_TOKENS = ["<pad>", "<eos>", "<bos>", "<unk>", "<image>"]
PALIGEMMA_WORDS = [*TEST_WORDS, "answer", "en", "caption", "detect"]


def paligemma_tokenizer(words: list[str] = PALIGEMMA_WORDS) -> PreTrainedTokenizerFast:
    """An offline word-level tokenizer with PaliGemma's special tokens (ids 0..4) and a newline token."""
    backend, _ = gemma_word_tokenizer(PALIGEMMA_SPECIAL_TOKENS, words)
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", pad_token="<pad>", eos_token="<eos>",
                                   bos_token="<bos>", extra_special_tokens={"image_token": "<image>"})


def tiny_paligemma_processor(image_size: int = 28, patch_size: int = 7, tokenizer=None) -> PaliGemmaProcessor:
    """HF's `PaliGemmaProcessor`: every image resized to image_size x image_size, each `<image>` expanded to
    (image_size / patch_size)^2 placeholders, `<bos>` after the last image and a newline after the prompt."""
    # image_seq_length: what PaliGemma's processor reads (a hub checkpoint's preprocessor_config.json holds it)
    image_processor = SiglipImageProcessorPil(size={"height": image_size, "width": image_size},
                                              image_seq_length=(image_size // patch_size) ** 2)
    return PaliGemmaProcessor(image_processor=image_processor, tokenizer=tokenizer or paligemma_tokenizer())


def tiny_paligemma_config(n_layers: int = 2, d_model: int = 40, n_heads: int = 5, n_kv_heads: int = 1,
                          d_head: int = 12, d_mlp: int = 72, image_size: int = 28, patch_size: int = 7,
                          vision_depth: int = 2, vision_width: int = 24, vision_heads: int = 3, gemma2: bool = False,
                          tokenizer=None, **text_overrides: Any) -> PaliGemmaConfig:
    """A tiny PaliGemma config whose token ids match `tiny_paligemma_processor`'s tokenizer.

    Sizes differ from PaliGemma's on purpose (d_head != d_model / n_heads, grouped KV heads, a patch grid
    that is not 16x16). gemma2=True: a Gemma 2 text model (PaliGemma 2), with sliding and global layers,
    `query_pre_attn_scalar` != d_head and soft-capping of attention scores and logits.
    """
    tokenizer = tokenizer or tiny_paligemma_processor(image_size, patch_size).tokenizer
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in PALIGEMMA_SPECIAL_TOKENS}
    text = dict(model_type="gemma2" if gemma2 else "gemma", vocab_size=len(tokenizer), hidden_size=d_model,
                intermediate_size=d_mlp, num_hidden_layers=n_layers, num_attention_heads=n_heads,
                num_key_value_heads=n_kv_heads, head_dim=d_head, max_position_embeddings=512, rms_norm_eps=1e-6,
                rope_parameters={"rope_type": "default", "rope_theta": 300.0},
                pad_token_id=ids["<pad>"], eos_token_id=ids["<eos>"], bos_token_id=ids["<bos>"])
    if gemma2:
        text.update(sliding_window=5, query_pre_attn_scalar=20, attn_logit_softcapping=3.0,
                    final_logit_softcapping=4.0,
                    layer_types=["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(n_layers)])
    text.update(text_overrides)
    vision = dict(model_type="siglip_vision_model", hidden_size=vision_width, intermediate_size=2 * vision_width,
                  num_hidden_layers=vision_depth, num_attention_heads=vision_heads, image_size=image_size,
                  patch_size=patch_size, vision_use_head=False, layer_norm_eps=1e-6, projection_dim=d_model)
    config = PaliGemmaConfig(text_config=text, vision_config=vision, image_token_index=ids["<image>"],
                             projection_dim=d_model, hidden_size=d_model, tie_word_embeddings=True)
    return config


def tiny_paligemma_model(seed: int = 0, attn_implementation: str = "eager", dtype: torch.dtype = torch.float32,
                         tokenizer=None, **config_kwargs: Any) -> PaliGemmaForConditionalGeneration:
    """A randomly initialised tiny `PaliGemmaForConditionalGeneration` (eval mode, norms perturbed so
    parity tests see Gemma's ``1 + w``). Stops at `<eos>`."""
    config = tiny_paligemma_config(tokenizer=tokenizer, **config_kwargs)
    config._attn_implementation = attn_implementation
    torch.manual_seed(seed)
    # HF wraps Module.to with functools.wraps: mypy reads the unbound signature (self first)
    model = PaliGemmaForConditionalGeneration(config).to(dtype).eval()  # type: ignore[arg-type]
    perturb_norms(model, seed)
    model.generation_config.eos_token_id = config.get_text_config().eos_token_id
    return model

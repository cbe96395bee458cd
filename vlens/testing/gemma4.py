"""A tiny random Gemma 4 (`Gemma4ForConditionalGeneration`: Gemma 4 decoder with per-layer embeddings,
its own patch-position vision encoder, pooled soft tokens) with HF's `Gemma4Processor`, built offline.

The tokenizer is word-level with Gemma 4's special tokens (`<bos>` added in front of every text; turns
``<|turn>`` / ``<turn|>``; ``<|image>`` / ``<|image|>`` / ``<image|>`` registered as the processor's boi /
image / eoi tokens); the image processor is Gemma 4's PIL one (aspect-preserving resize to a patch budget,
patches padded to the budget with position (-1, -1)).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from tokenizers import processors
from transformers import (
    Gemma4Config,
    Gemma4ForConditionalGeneration,
    Gemma4ImageProcessorPil,
    PreTrainedTokenizerFast,
)

from vlens.core.architectures.gemma4_processor import Gemma4ImageTextProcessor
from vlens.testing.common import TEST_WORDS, perturb_norms
from vlens.testing.gemma3 import gemma_word_tokenizer

GEMMA4_SPECIAL_TOKENS = ["<pad>", "<eos>", "<bos>", "<unk>", "<|turn>", "<turn|>", "<|image>", "<image|>",
                         "<|image|>", "<|video|>", "<|audio>", "<audio|>", "<|audio|>"]
GEMMA4_WORDS = [*TEST_WORDS, "model"]

# Gemma 4's chat format: a turn is <|turn>role\n ... <turn|>\n, the assistant is "model", each image one
# <|image|> that the processor expands to <|image> + soft tokens + <image|>.
GEMMA4_CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'assistant' -%}{%- set role = 'model' -%}{%- else -%}"
    "{%- set role = message['role'] -%}{%- endif -%}"
    "{{ '<|turn>' + role + '\n' }}"
    "{%- if message['content'] is string -%}{{ message['content'] | trim }}"
    "{%- else -%}{%- for item in message['content'] -%}"
    "{%- if item['type'] == 'image' -%}{{ '<|image|>' }}"
    "{%- elif item['type'] == 'text' -%}{{ item['text'] | trim }}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}"
    "{{ '<turn|>\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|turn>model\n' }}{%- endif -%}"
)


def gemma4_tokenizer(words: list[str] = GEMMA4_WORDS) -> PreTrainedTokenizerFast:
    """An offline word-level tokenizer with Gemma 4's special tokens, newline tokens, BOS added."""
    backend, vocab = gemma_word_tokenizer(GEMMA4_SPECIAL_TOKENS, words)
    bos = vocab["<bos>"]
    backend.post_processor = processors.TemplateProcessing(single="<bos> $A", pair="<bos> $A <bos> $B",
                                                           special_tokens=[("<bos>", bos)])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, unk_token="<unk>", pad_token="<pad>", eos_token="<eos>", bos_token="<bos>",
        extra_special_tokens={"boi_token": "<|image>", "eoi_token": "<image|>", "image_token": "<|image|>",
                              "boa_token": "<|audio>", "eoa_token": "<audio|>", "audio_token": "<|audio|>"},
    )
    tokenizer.chat_template = GEMMA4_CHAT_TEMPLATE
    return tokenizer


def gemma4_image_processor(patch_size: int = 4, pooling_kernel_size: int = 2,
                           max_soft_tokens: int = 70) -> Gemma4ImageProcessorPil:
    """Gemma 4's PIL image processor: each image resized (aspect kept) to at most max_soft_tokens pooled tokens,
    sides multiples of patch_size * pooling_kernel_size (max_soft_tokens is one of HF's 70, 140, ...)."""
    return Gemma4ImageProcessorPil(patch_size=patch_size, pooling_kernel_size=pooling_kernel_size,
                                   max_soft_tokens=max_soft_tokens)


def tiny_gemma4_processor(patch_size: int = 4, pooling_kernel_size: int = 2, max_soft_tokens: int = 70,
                          tokenizer=None) -> Gemma4ImageTextProcessor:
    """vlens's `Gemma4ImageTextProcessor` (HF's `Gemma4Processor` needs a video processor, which needs
    torchvision): each `<|image|>` becomes ``<|image>`` + the image's soft tokens + ``<image|>``."""
    image_processor = gemma4_image_processor(patch_size, pooling_kernel_size, max_soft_tokens)
    return Gemma4ImageTextProcessor(tokenizer or gemma4_tokenizer(), image_processor,
                                    chat_template=GEMMA4_CHAT_TEMPLATE)


def tiny_gemma4_config(vocab_size: int | None = None, n_layers: int = 3, d_model: int = 48, n_heads: int = 4,
                       n_kv_heads: int = 2, d_head: int = 12, global_head_dim: int = 20, sliding_window: int = 6,
                       layer_types: Sequence[str] | None = None, d_mlp: int = 80, ple_dim: int = 8,
                       rope_local_theta: float = 100.0, rope_global_theta: float = 5000.0,
                       partial_rotary_factor: float = 0.5, final_logit_softcapping: float | None = 12.0,
                       bidirectional_vision: bool = True, patch_size: int = 4, pooling_kernel_size: int = 2,
                       vision_depth: int = 2, vision_width: int = 24, vision_heads: int = 2,
                       vision_head_dim: int = 12, tokenizer=None, **text_overrides: Any) -> Gemma4Config:
    """A tiny Gemma 4 config whose token ids match `gemma4_tokenizer`.

    Defaults differ from Gemma's on purpose: d_head != d_model / n_heads, a global head size of its own
    (global_head_dim), two local layers per global one, a window shorter than a chat prompt, distinct rotary
    bases with proportional (partial) rotary on the global layers, per-layer embeddings (ple_dim), soft-capped
    logits, bidirectional attention within each image on the sliding layers.
    """
    tokenizer = tokenizer or gemma4_tokenizer()
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in GEMMA4_SPECIAL_TOKENS}
    types = list(layer_types) if layer_types else ["sliding_attention" if (i + 1) % 3 else "full_attention"
                                                   for i in range(n_layers)]
    vocab = vocab_size or len(tokenizer)
    text = dict(vocab_size=vocab, vocab_size_per_layer_input=vocab, hidden_size=d_model,
                intermediate_size=d_mlp, num_hidden_layers=n_layers, num_attention_heads=n_heads,
                num_key_value_heads=n_kv_heads, head_dim=d_head, global_head_dim=global_head_dim,
                sliding_window=sliding_window, layer_types=types, hidden_size_per_layer_input=ple_dim,
                max_position_embeddings=512, rms_norm_eps=1e-6, final_logit_softcapping=final_logit_softcapping,
                use_bidirectional_attention="vision" if bidirectional_vision else None,
                rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": rope_local_theta},
                                 "full_attention": {"rope_type": "proportional", "rope_theta": rope_global_theta,
                                                    "partial_rotary_factor": partial_rotary_factor}},
                pad_token_id=ids["<pad>"], eos_token_id=ids["<eos>"], bos_token_id=ids["<bos>"])
    text.update(text_overrides)
    vision = dict(hidden_size=vision_width, intermediate_size=2 * vision_width, num_hidden_layers=vision_depth,
                  num_attention_heads=vision_heads, num_key_value_heads=vision_heads, head_dim=vision_head_dim,
                  patch_size=patch_size, pooling_kernel_size=pooling_kernel_size, position_embedding_size=64,
                  rope_parameters={"rope_type": "axial", "rope_theta": 100.0})
    return Gemma4Config(text_config=text, vision_config=vision, audio_config=None,
                        boi_token_id=ids["<|image>"], eoi_token_id=ids["<image|>"],
                        image_token_id=ids["<|image|>"], video_token_id=ids["<|video|>"],
                        boa_token_id=ids["<|audio>"], eoa_token_index=ids["<audio|>"],
                        audio_token_id=ids["<|audio|>"], tie_word_embeddings=True)


def tiny_gemma4_model(seed: int = 0, attn_implementation: str = "eager", dtype: torch.dtype = torch.float32,
                      tokenizer=None, **config_kwargs: Any):
    """A randomly initialised tiny `Gemma4ForConditionalGeneration` (eval mode).

    HF initialises norms to one, layer scalars to one and the patch position table to ones; they are drawn
    at random here so parity tests see them. Stops at `<eos>` or `<turn|>`.
    """
    tokenizer = tokenizer or gemma4_tokenizer()
    config = tiny_gemma4_config(tokenizer=tokenizer, **config_kwargs)
    config._attn_implementation = attn_implementation
    torch.manual_seed(seed)
    # HF wraps Module.to with functools.wraps: mypy reads the unbound signature (self first)
    model = Gemma4ForConditionalGeneration(config).to(dtype).eval()  # type: ignore[arg-type]
    generator = torch.Generator().manual_seed(seed + 2)
    with torch.no_grad():
        for name, buffer in model.named_buffers():
            if name.endswith("layer_scalar"):
                buffer.copy_((0.5 + torch.rand(buffer.shape, generator=generator)).to(buffer.dtype))
        for name, param in model.named_parameters():  # MoE routers: ones at init
            if name.endswith(("router.scale", "router.per_expert_scale")):
                param.copy_((0.5 + torch.rand(param.shape, generator=generator)).to(param.dtype))
        table = model.model.vision_tower.patch_embedder.position_embedding_table
        table.copy_((0.5 * torch.randn(table.shape, generator=generator)).to(table.dtype))
    perturb_norms(model, seed)
    model.generation_config.eos_token_id = [tokenizer.convert_tokens_to_ids(t) for t in ("<eos>", "<turn|>")]
    return model

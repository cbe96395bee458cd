"""A tiny random Gemma 3 (`Gemma3ForConditionalGeneration`: Gemma 3 decoder, SigLIP tower, pooled
projector) with HF's own `Gemma3Processor`, built offline.

The tokenizer is word-level with Gemma's special tokens (`<bos>` added in front of every text, as the
real one does; `<start_of_turn>` / `<end_of_turn>`; `<start_of_image>`, `<image_soft_token>`,
`<end_of_image>` registered as the processor's boi / image / eoi tokens) and Gemma 3's chat template;
the image processor is Gemma's PIL one (fixed square resize, pan-and-scan crops on request).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from tokenizers import Tokenizer, models, pre_tokenizers, processors
from transformers import (
    Gemma3Config,
    Gemma3ForConditionalGeneration,
    Gemma3ImageProcessorPil,
    Gemma3Processor,
    PreTrainedTokenizerFast,
)

from vlens.testing.common import TEST_WORDS, perturb_norms

GEMMA3_SPECIAL_TOKENS = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>",
                         "<start_of_image>", "<end_of_image>", "<image_soft_token>"]
# the words of the chat format and of the processor's pan-and-scan sentence
GEMMA3_WORDS = [*TEST_WORDS, "model", "Here", "original", "image", "and", "here", "are", "some", "crops", "to",
                "help", "you", "see", "better"]

# Gemma 3's chat format (google/gemma-3-*-it): system text joins the first user turn, the assistant
# is "model", every image is one <start_of_image> that the processor expands.
GEMMA3_CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{%- if messages[0]['role'] == 'system' -%}"
    "{%- if messages[0]['content'] is string -%}{%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}"
    "{%- else -%}{%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}{%- endif -%}"
    "{%- set loop_messages = messages[1:] -%}"
    "{%- else -%}{%- set first_user_prefix = '' -%}{%- set loop_messages = messages -%}{%- endif -%}"
    "{%- for message in loop_messages -%}"
    "{%- if message['role'] == 'assistant' -%}{%- set role = 'model' -%}{%- else -%}"
    "{%- set role = message['role'] -%}{%- endif -%}"
    "{{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else '') }}"
    "{%- if message['content'] is string -%}{{ message['content'] | trim }}"
    "{%- else -%}{%- for item in message['content'] -%}"
    "{%- if item['type'] == 'image' -%}{{ '<start_of_image>' }}"
    "{%- elif item['type'] == 'text' -%}{{ item['text'] | trim }}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}"
    "{{ '<end_of_turn>\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\n' }}{%- endif -%}"
)


def gemma_word_tokenizer(specials: list[str], words: list[str]) -> tuple[Tokenizer, dict[str, int]]:
    """The `tokenizers` backend of Gemma-family test tokenizers: `specials` first, a newline token, `words`;
    newlines are tokens of their own, spaces split, punctuation apart. Returns (backend, vocab)."""
    vocab: dict[str, int] = {}
    for token in [*specials, "\n", *words]:
        vocab.setdefault(token, len(vocab))
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split("\n", "isolated"),
        pre_tokenizers.Split(" ", "removed"),
        pre_tokenizers.Punctuation(),
    ])
    backend.add_special_tokens(specials)
    return backend, vocab


def gemma3_tokenizer(words: list[str] = GEMMA3_WORDS) -> PreTrainedTokenizerFast:
    """An offline word-level tokenizer with Gemma 3's special tokens (ids 0..8), newline tokens, BOS added."""
    backend, vocab = gemma_word_tokenizer(GEMMA3_SPECIAL_TOKENS, words)
    bos = vocab["<bos>"]
    backend.post_processor = processors.TemplateProcessing(single="<bos> $A", pair="<bos> $A <bos> $B",
                                                           special_tokens=[("<bos>", bos)])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, unk_token="<unk>", pad_token="<pad>", eos_token="<eos>", bos_token="<bos>",
        extra_special_tokens={"boi_token": "<start_of_image>", "eoi_token": "<end_of_image>",
                              "image_token": "<image_soft_token>", "sot_token": "<start_of_turn>",
                              "eot_token": "<end_of_turn>"},
    )
    tokenizer.chat_template = GEMMA3_CHAT_TEMPLATE
    return tokenizer


def gemma3_image_processor(image_size: int = 32, pan_and_scan: bool = False, min_crop_size: int = 16,
                           max_crops: int = 3, min_ratio: float = 1.2) -> Gemma3ImageProcessorPil:
    """Gemma 3's PIL image processor: every image (and crop) resized to image_size x image_size."""
    return Gemma3ImageProcessorPil(size={"height": image_size, "width": image_size}, do_pan_and_scan=pan_and_scan,
                                   pan_and_scan_min_crop_size=min_crop_size, pan_and_scan_max_num_crops=max_crops,
                                   pan_and_scan_min_ratio_to_activate=min_ratio)


def tiny_gemma3_processor(image_size: int = 32, tokens_per_image: int = 4, tokenizer=None,
                          **image_kwargs: Any) -> Gemma3Processor:
    """HF's `Gemma3Processor`: each `<start_of_image>` becomes ``\\n\\n<start_of_image>`` + tokens_per_image x
    `<image_soft_token>` + ``<end_of_image>\\n\\n`` (and, with ``pan_and_scan=True``, one more such block per
    crop of a wide or tall image, after "Here is the original image ... crops to help you see better")."""
    image_processor = gemma3_image_processor(image_size, **image_kwargs)
    processor = Gemma3Processor(image_processor=image_processor, tokenizer=tokenizer or gemma3_tokenizer(),
                                chat_template=GEMMA3_CHAT_TEMPLATE, image_seq_length=tokens_per_image)
    if image_processor.do_pan_and_scan:
        # the processor's own defaults (pan-and-scan off) override the image processor's at every call
        processor.images_kwargs = {key: getattr(image_processor, key) for key in Gemma3Processor.images_kwargs}
    return processor


def tiny_gemma3_config(vocab_size: int | None = None, n_layers: int = 3, d_model: int = 48, n_heads: int = 4,
                       n_kv_heads: int = 2, d_head: int = 16, d_mlp: int = 80, sliding_window: int = 6,
                       layer_types: Sequence[str] | None = None, query_pre_attn_scalar: int = 20,
                       rope_local_theta: float = 100.0, rope_global_theta: float = 5000.0,
                       tokens_per_image: int = 4, image_size: int = 32, patch_size: int = 8, vision_depth: int = 2,
                       vision_width: int = 32, vision_heads: int = 2, tokenizer=None, **text_overrides: Any):
    """A tiny Gemma 3 config whose token ids match `gemma3_tokenizer`.

    Defaults differ from Gemma's on purpose: d_head != d_model / n_heads, query_pre_attn_scalar != d_head,
    a sliding window shorter than a chat prompt, two local layers per global one (`layer_types`), distinct
    rotary bases; the vision tower's (image_size / patch_size)^2 patches are average-pooled to
    tokens_per_image tokens (a square number whose side divides the patch grid's).
    """
    tokenizer = tokenizer or gemma3_tokenizer()
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in GEMMA3_SPECIAL_TOKENS}
    types = list(layer_types) if layer_types else ["sliding_attention" if (i + 1) % 3 else "full_attention"
                                                   for i in range(n_layers)]
    text = dict(vocab_size=vocab_size or len(tokenizer), hidden_size=d_model, intermediate_size=d_mlp,
                num_hidden_layers=n_layers, num_attention_heads=n_heads, num_key_value_heads=n_kv_heads,
                head_dim=d_head, sliding_window=sliding_window, layer_types=types,
                query_pre_attn_scalar=query_pre_attn_scalar, max_position_embeddings=512, rms_norm_eps=1e-6,
                rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": rope_local_theta},
                                 "full_attention": {"rope_type": "default", "rope_theta": rope_global_theta}},
                pad_token_id=ids["<pad>"], eos_token_id=ids["<eos>"], bos_token_id=ids["<bos>"])
    text.update(text_overrides)
    vision = dict(model_type="siglip_vision_model", hidden_size=vision_width, intermediate_size=2 * vision_width,
                  num_hidden_layers=vision_depth, num_attention_heads=vision_heads, image_size=image_size,
                  patch_size=patch_size, vision_use_head=False, layer_norm_eps=1e-6)
    return Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=tokens_per_image,
                        boi_token_index=ids["<start_of_image>"], eoi_token_index=ids["<end_of_image>"],
                        image_token_index=ids["<image_soft_token>"], tie_word_embeddings=True)


def tiny_gemma3_model(seed: int = 0, attn_implementation: str = "eager", dtype: torch.dtype = torch.float32,
                      tokenizer=None, **config_kwargs: Any):
    """A randomly initialised tiny `Gemma3ForConditionalGeneration` (eval mode).

    HF initialises every norm offset and the projector to zero (the image features would all be zero);
    they are drawn at random here so parity tests see them. Stops at `<eos>` or `<end_of_turn>`.
    """
    tokenizer = tokenizer or gemma3_tokenizer()
    config = tiny_gemma3_config(tokenizer=tokenizer, **config_kwargs)
    config._attn_implementation = attn_implementation
    torch.manual_seed(seed)
    # HF wraps Module.to with functools.wraps: mypy reads the unbound signature (self first)
    model = Gemma3ForConditionalGeneration(config).to(dtype).eval()  # type: ignore[arg-type]
    generator = torch.Generator().manual_seed(seed + 2)
    with torch.no_grad():
        projection = model.model.multi_modal_projector.mm_input_projection_weight
        projection.copy_(torch.randn(projection.shape, generator=generator).to(projection.dtype)
                         / projection.shape[0] ** 0.5)
    perturb_norms(model, seed)
    model.generation_config.eos_token_id = [tokenizer.convert_tokens_to_ids(t) for t in ("<eos>", "<end_of_turn>")]
    return model

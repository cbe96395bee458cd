"""A tiny random Mistral 3 (`Mistral3ForConditionalGeneration`: Pixtral vision tower, RMSNorm + patch merger +
MLP projector, Mistral decoder) with HF's own `PixtralProcessor`, built offline.

The tokenizer is word-level with Mistral's special tokens (`<unk>`, `<s>` added in front of every text,
`</s>`, `[INST]` / `[/INST]`, `[IMG]`, `[IMG_BREAK]`, `[IMG_END]`) and a Mistral-style chat template; the image
processor is Pixtral's PIL one (longest edge bounded, each side a multiple of patch_size x merge, no crop).
"""

from __future__ import annotations

from typing import Any

import torch
from tokenizers import processors
from transformers import (
    Mistral3Config,
    Mistral3ForConditionalGeneration,
    PixtralImageProcessorPil,
    PreTrainedTokenizerFast,
)

from vlens.core.architectures.mistral3 import PixtralImageTextProcessor
from vlens.testing.common import TEST_WORDS, perturb_norms
from vlens.testing.gemma3 import gemma_word_tokenizer

MISTRAL3_SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<pad>", "[INST]", "[/INST]", "[IMG]", "[IMG_BREAK]", "[IMG_END]"]

# Mistral's format: <s>[INST] the images then the text [/INST]
MISTRAL3_CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'user' -%}{{ '[INST]' }}"
    "{%- if message['content'] is string -%}{{ message['content'] }}"
    "{%- else -%}{%- for item in message['content'] -%}"
    "{%- if item['type'] == 'image' -%}{{ '[IMG]' }}{%- elif item['type'] == 'text' -%}{{ item['text'] }}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}{{ '[/INST]' }}"
    "{%- elif message['role'] == 'assistant' -%}"
    "{%- if message['content'] is string -%}{{ message['content'] }}"
    "{%- else -%}{{ message['content'][0]['text'] }}{%- endif -%}{{ eos_token }}"
    "{%- endif -%}"
    "{%- endfor -%}"
)


def mistral3_tokenizer(words: list[str] = TEST_WORDS) -> PreTrainedTokenizerFast:
    """An offline word-level tokenizer with Mistral 3's special tokens (ids 0..8) and BOS added."""
    backend, vocab = gemma_word_tokenizer(MISTRAL3_SPECIAL_TOKENS, words)
    backend.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                           special_tokens=[("<s>", vocab["<s>"])])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", pad_token="<pad>",
                                        eos_token="</s>", bos_token="<s>")
    tokenizer.chat_template = MISTRAL3_CHAT_TEMPLATE
    return tokenizer


def tiny_mistral3_processor(longest_edge: int = 48, patch_size: int = 4, merge: int = 2,
                            tokenizer=None) -> PixtralImageTextProcessor:
    """HF's `PixtralProcessor` (vlens's torchvision-free `PixtralImageTextProcessor`): each image resized so its longest edge is at most `longest_edge` and each side a
    multiple of patch_size x merge; each `[IMG]` expanded to rows of `[IMG]` tokens, each row closed by
    `[IMG_BREAK]`, the last by `[IMG_END]`."""
    image_processor = PixtralImageProcessorPil(size={"longest_edge": longest_edge},
                                               patch_size={"height": patch_size, "width": patch_size})
    return PixtralImageTextProcessor(tokenizer or mistral3_tokenizer(), image_processor, patch_size=patch_size,
                                     spatial_merge_size=merge, chat_template=MISTRAL3_CHAT_TEMPLATE)


def tiny_mistral3_config(n_layers: int = 2, d_model: int = 40, n_heads: int = 5, n_kv_heads: int = 1,
                         d_head: int = 12, d_mlp: int = 56, sliding_window: int | None = None, patch_size: int = 4,
                         merge: int = 2, vision_depth: int = 2, vision_width: int = 24, vision_heads: int = 2,
                         tokenizer=None, **overrides: Any) -> Mistral3Config:
    """A tiny Mistral 3 config whose token ids match `mistral3_tokenizer`.

    Sizes unlike Mistral's (d_head != d_model / n_heads, grouped KV heads, a 2x2 merge of 4 px patches).
    `overrides`: text-config fields, or the top-level ``vision_feature_layer`` / ``multimodal_projector_bias``
    / ``projector_hidden_act``.
    """
    tokenizer = tokenizer or mistral3_tokenizer()
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in MISTRAL3_SPECIAL_TOKENS}
    top = {k: overrides.pop(k) for k in ("vision_feature_layer", "multimodal_projector_bias", "projector_hidden_act")
           if k in overrides}
    text = dict(model_type="mistral", vocab_size=len(tokenizer), hidden_size=d_model, intermediate_size=d_mlp,
                num_hidden_layers=n_layers, num_attention_heads=n_heads, num_key_value_heads=n_kv_heads,
                head_dim=d_head, sliding_window=sliding_window, max_position_embeddings=512, rms_norm_eps=1e-5,
                rope_parameters={"rope_type": "default", "rope_theta": 700.0},
                pad_token_id=ids["<pad>"], eos_token_id=ids["</s>"], bos_token_id=ids["<s>"])
    text.update(overrides)
    vision = dict(model_type="pixtral", hidden_size=vision_width, intermediate_size=2 * vision_width,
                  num_hidden_layers=vision_depth, num_attention_heads=vision_heads, image_size=64,
                  patch_size=patch_size, head_dim=vision_width // vision_heads,
                  rope_parameters={"rope_type": "default", "rope_theta": 50.0})
    return Mistral3Config(text_config=text, vision_config=vision, image_token_index=ids["[IMG]"],
                          spatial_merge_size=merge, **top)


def tiny_mistral3_model(seed: int = 0, attn_implementation: str = "eager", dtype: torch.dtype = torch.float32,
                        tokenizer=None, **config_kwargs: Any) -> Mistral3ForConditionalGeneration:
    """A randomly initialised tiny `Mistral3ForConditionalGeneration` (eval mode, norms perturbed). Stops at `</s>`."""
    config = tiny_mistral3_config(tokenizer=tokenizer, **config_kwargs)
    config._attn_implementation = attn_implementation
    torch.manual_seed(seed)
    model = Mistral3ForConditionalGeneration(config).to(dtype).eval()  # type: ignore[arg-type]
    perturb_norms(model, seed)
    model.generation_config.eos_token_id = config.get_text_config().eos_token_id
    return model

"""Tiny random Idefics3 and SmolVLM models (SigLIP-style tower, pixel shuffle + connector, Llama decoder at
`model.text_model`) with HF's processors around the PIL `Idefics3ImageProcessorPil` /
`SmolVLMImageProcessorPil` (image splitting with row/column tags and a global image), built offline.

Idefics3 uses HF's own `Idefics3Processor`; SmolVLM the image-only `SmolVLMImageTextProcessor` (HF's
needs a torchvision video processor and num2words). Sub-image side, patch size, scale factor and the
longest edge images are resized to are parameters, so tests can pick sizes unlike the released ones
(364 / 512 px sub-images, 14 / 16 px patches, scale factor 2-4).
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import (
    Idefics3Config,
    Idefics3ForConditionalGeneration,
    Idefics3ImageProcessorPil,
    Idefics3Processor,
    PreTrainedTokenizerFast,
    SmolVLMConfig,
    SmolVLMForConditionalGeneration,
    SmolVLMImageProcessorPil,
)

from vlens.core.architectures.idefics3 import SmolVLMImageTextProcessor
from vlens.testing.common import TEST_WORDS, perturb_norms, word_level_tokenizer

# every tag a layout of up to 6 x 6 sub-images names (as the released tokenizers have)
IDEFICS3_TILE_TAGS = [f"<row_{r}_col_{c}>" for r in range(1, 7) for c in range(1, 7)]
IDEFICS3_SPECIAL_TOKENS = ["<|endoftext|>", "<|begin_of_text|>", "<end_of_utterance>", "<fake_token_around_image>",
                           "<image>", "<global-img>", *IDEFICS3_TILE_TAGS]
SMOLVLM_SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<end_of_utterance>", "<fake_token_around_image>",
                          "<image>", "<global-img>", *IDEFICS3_TILE_TAGS]
IDEFICS3_WORDS = [*TEST_WORDS, "User", "Assistant", ":"]

# HuggingFaceM4/Idefics3-8B-Llama3's chat format: "<|begin_of_text|>User:<image>{text}<end_of_utterance>\nAssistant:"
IDEFICS3_CHAT_TEMPLATE = (
    "<|begin_of_text|>{% for message in messages %}{{ message['role'] | capitalize }}"
    "{% if message['content'][0]['type'] == 'image' %}{{ ':' }}{% else %}{{ ': ' }}{% endif %}"
    "{% for line in message['content'] %}{% if line['type'] == 'text' %}{{ line['text'] }}"
    "{% elif line['type'] == 'image' %}{{ '<image>' }}{% endif %}{% endfor %}<end_of_utterance>\n{% endfor %}"
    "{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}"
)
# HuggingFaceTB/SmolVLM-*-Instruct's: the same with "<|im_start|>" in front
SMOLVLM_CHAT_TEMPLATE = IDEFICS3_CHAT_TEMPLATE.replace("<|begin_of_text|>", "<|im_start|>", 1)


def idefics3_tokenizer(smolvlm: bool = False) -> PreTrainedTokenizerFast:
    """An offline word-level tokenizer with Idefics3's (or SmolVLM's) specials: ``<image>``,
    ``<fake_token_around_image>``, ``<global-img>``, every ``<row_r_col_c>`` up to 6 x 6, and
    ``<end_of_utterance>`` as EOS, with the family's chat template."""
    specials = SMOLVLM_SPECIAL_TOKENS if smolvlm else IDEFICS3_SPECIAL_TOKENS
    tokenizer = word_level_tokenizer(words=IDEFICS3_WORDS, specials=specials, pad_token="<|endoftext|>",
                                     eos_token="<end_of_utterance>",
                                     bos_token=None if smolvlm else "<|begin_of_text|>", keep_newlines=True)
    tokenizer.chat_template = SMOLVLM_CHAT_TEMPLATE if smolvlm else IDEFICS3_CHAT_TEMPLATE
    return tokenizer


def _image_processor(cls, sub_image: int, longest_edge: int, split: bool):
    return cls(size={"longest_edge": longest_edge}, max_image_size={"longest_edge": sub_image},
               do_image_splitting=split)


def tiny_idefics3_processor(sub_image: int = 32, patch_size: int = 8, scale_factor: int = 2,
                            longest_edge: int | None = None, split: bool = True, tokenizer=None) -> Idefics3Processor:
    """HF's `Idefics3Processor` with the PIL image processor: images are resized to `longest_edge`
    (default 2 sub-images), split into `sub_image` px squares (+ the global image), each
    ``(sub_image // patch_size // scale_factor) ** 2`` tokens."""
    image_processor = _image_processor(Idefics3ImageProcessorPil, sub_image, longest_edge or 2 * sub_image, split)
    return Idefics3Processor(image_processor=image_processor, tokenizer=tokenizer or idefics3_tokenizer(),
                             image_seq_len=(sub_image // patch_size // scale_factor) ** 2,
                             chat_template=IDEFICS3_CHAT_TEMPLATE)


def tiny_smolvlm_processor(sub_image: int = 32, patch_size: int = 8, scale_factor: int = 2,
                           longest_edge: int | None = None, split: bool = True,
                           tokenizer=None) -> SmolVLMImageTextProcessor:
    """SmolVLM's processor (image-only) with the PIL image processor (see `tiny_idefics3_processor`)."""
    image_processor = _image_processor(SmolVLMImageProcessorPil, sub_image, longest_edge or 2 * sub_image, split)
    return SmolVLMImageTextProcessor(image_processor=image_processor,
                                     tokenizer=tokenizer or idefics3_tokenizer(smolvlm=True),
                                     image_seq_len=(sub_image // patch_size // scale_factor) ** 2,
                                     chat_template=SMOLVLM_CHAT_TEMPLATE)


# the sizes `tiny_idefics3_config` takes by keyword; any other keyword is a text-config field
IDEFICS3_CONFIG_DEFAULTS: dict[str, Any] = dict(
    n_layers=2, d_model=48, n_heads=4, n_kv_heads=2, d_mlp=80, sub_image=32, patch_size=8, scale_factor=2,
    vision_depth=3, vision_width=24, vision_heads=3)


def tiny_idefics3_config(smolvlm: bool = False, tokenizer=None, **overrides: Any):
    """A tiny Idefics3 (or SmolVLM) config whose token ids match `idefics3_tokenizer`.

    Keywords: those of `IDEFICS3_CONFIG_DEFAULTS` (decoder sizes, sub-image side, patch size, pixel-shuffle
    scale factor, the vision tower's sizes); any other keyword is a field of the Llama text config.
    """
    tokenizer = tokenizer or idefics3_tokenizer(smolvlm)
    o = {**IDEFICS3_CONFIG_DEFAULTS, **{k: v for k, v in overrides.items() if k in IDEFICS3_CONFIG_DEFAULTS}}
    text = dict(model_type="llama", vocab_size=len(tokenizer), hidden_size=o["d_model"], intermediate_size=o["d_mlp"],
                num_hidden_layers=o["n_layers"], num_attention_heads=o["n_heads"],
                num_key_value_heads=o["n_kv_heads"], max_position_embeddings=1024, rms_norm_eps=1e-5,
                pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
    text.update({k: v for k, v in overrides.items() if k not in IDEFICS3_CONFIG_DEFAULTS})
    vision = dict(hidden_size=o["vision_width"], intermediate_size=2 * o["vision_width"],
                  num_hidden_layers=o["vision_depth"], num_attention_heads=o["vision_heads"],
                  image_size=o["sub_image"], patch_size=o["patch_size"])
    config_class = SmolVLMConfig if smolvlm else Idefics3Config
    return config_class(text_config=text, vision_config=vision, image_token_id=tokenizer.convert_tokens_to_ids("<image>"),
                        scale_factor=o["scale_factor"], tie_word_embeddings=False)


def _build(model_class, config, seed: int, attn_implementation: str, dtype: torch.dtype):
    config._attn_implementation = attn_implementation
    torch.manual_seed(seed)
    model = model_class(config).to(dtype).eval()
    perturb_norms(model, seed)
    return model


def tiny_idefics3_model(seed: int = 0, attn_implementation: str = "eager", dtype: torch.dtype = torch.float32,
                        **config_kwargs: Any) -> Idefics3ForConditionalGeneration:
    """A randomly initialised tiny `Idefics3ForConditionalGeneration` (eval mode, norms and biases perturbed)."""
    return _build(Idefics3ForConditionalGeneration, tiny_idefics3_config(**config_kwargs), seed, attn_implementation,
                  dtype)


def tiny_smolvlm_model(seed: int = 0, attn_implementation: str = "eager", dtype: torch.dtype = torch.float32,
                       **config_kwargs: Any) -> SmolVLMForConditionalGeneration:
    """A randomly initialised tiny `SmolVLMForConditionalGeneration` (eval mode, norms and biases perturbed)."""
    return _build(SmolVLMForConditionalGeneration, tiny_idefics3_config(smolvlm=True, **config_kwargs), seed,
                  attn_implementation, dtype)

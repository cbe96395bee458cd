"""Tiny random Idefics2 models (SigLIP-style tower with bucketed positions, MLP + perceiver resampler
connector, Mistral decoder at `model.text_model`) with HF's own `Idefics2Processor` around the PIL
`Idefics2ImageProcessorPil` (optional split into 4 crops + the whole image), built offline.

The shortest / longest edge images are resized to, the patch size and the number of perceiver latents
are parameters, so tests can pick sizes unlike the released ones (378-980 px, 14 px patches, 64 latents).
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import (
    Idefics2Config,
    Idefics2ForConditionalGeneration,
    Idefics2ImageProcessorPil,
    Idefics2Processor,
    PreTrainedTokenizerFast,
)

from vlens.testing.common import TEST_WORDS, perturb_norms, word_level_tokenizer

IDEFICS2_SPECIAL_TOKENS = ["<unk_pad>", "<s>", "</s>", "<end_of_utterance>", "<fake_token_around_image>", "<image>"]
IDEFICS2_WORDS = [*TEST_WORDS, "User", "Assistant", ":"]

# HuggingFaceM4/idefics2-8b's chat format: "<s>User:<image>{text}<end_of_utterance>\nAssistant:"
IDEFICS2_CHAT_TEMPLATE = (
    "<s>{% for message in messages %}{{ message['role'] | capitalize }}"
    "{% if message['content'][0]['type'] == 'image' %}{{ ':' }}{% else %}{{ ': ' }}{% endif %}"
    "{% for line in message['content'] %}{% if line['type'] == 'text' %}{{ line['text'] }}"
    "{% elif line['type'] == 'image' %}{{ '<image>' }}{% endif %}{% endfor %}<end_of_utterance>\n{% endfor %}"
    "{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}"
)


def idefics2_tokenizer() -> PreTrainedTokenizerFast:
    """An offline word-level tokenizer with Idefics2's specials (``<image>``, ``<fake_token_around_image>``,
    ``<end_of_utterance>`` as EOS) and its chat template."""
    tokenizer = word_level_tokenizer(words=IDEFICS2_WORDS, specials=IDEFICS2_SPECIAL_TOKENS, pad_token="<unk_pad>",
                                     eos_token="<end_of_utterance>", bos_token="<s>", keep_newlines=True)
    tokenizer.chat_template = IDEFICS2_CHAT_TEMPLATE
    return tokenizer


def tiny_idefics2_processor(shortest_edge: int = 24, longest_edge: int = 40, n_latents: int = 5,
                            split: bool = False, tokenizer=None) -> Idefics2Processor:
    """HF's `Idefics2Processor` with the PIL image processor: each image (or, with `split`, each of its 4
    crops and the whole image) resized into [shortest_edge, longest_edge] keeping its aspect, padded to the
    batch's largest frame; `n_latents` placeholders per frame (the perceiver's latents)."""
    image_processor = Idefics2ImageProcessorPil(size={"shortest_edge": shortest_edge, "longest_edge": longest_edge},
                                                do_image_splitting=split)
    return Idefics2Processor(image_processor=image_processor, tokenizer=tokenizer or idefics2_tokenizer(),
                             image_seq_len=n_latents, chat_template=IDEFICS2_CHAT_TEMPLATE)


# the sizes `tiny_idefics2_config` takes by keyword; any other keyword is a text-config field
IDEFICS2_CONFIG_DEFAULTS: dict[str, Any] = dict(
    n_layers=2, d_model=48, n_heads=4, n_kv_heads=2, d_mlp=80, image_size=40, patch_size=8, vision_depth=2,
    vision_width=24, vision_heads=3, n_latents=5, resampler_depth=2, resampler_heads=3, resampler_head_dim=10,
    resampler_kv_heads=1, vision_init=0.1)


def tiny_idefics2_config(tokenizer=None, **overrides: Any) -> Idefics2Config:
    """A tiny Idefics2 config whose token ids match `idefics2_tokenizer`.

    Keywords: those of `IDEFICS2_CONFIG_DEFAULTS` (decoder sizes, the tower's position-bucket image size and
    patch size, its sizes and init std (wider than HF's 0.02, so that an edit inside the tiny tower
    still shows in the logits), the perceiver's latents / depth / heads); any other keyword is a field of the
    Mistral text config.
    """
    tokenizer = tokenizer or idefics2_tokenizer()
    o = {**IDEFICS2_CONFIG_DEFAULTS, **{k: v for k, v in overrides.items() if k in IDEFICS2_CONFIG_DEFAULTS}}
    text = dict(model_type="mistral", vocab_size=len(tokenizer), hidden_size=o["d_model"],
                intermediate_size=o["d_mlp"], num_hidden_layers=o["n_layers"], num_attention_heads=o["n_heads"],
                num_key_value_heads=o["n_kv_heads"], max_position_embeddings=1024, rms_norm_eps=1e-5,
                pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id, sliding_window=None)
    text.update({k: v for k, v in overrides.items() if k not in IDEFICS2_CONFIG_DEFAULTS})
    vision = dict(hidden_size=o["vision_width"], intermediate_size=2 * o["vision_width"],
                  num_hidden_layers=o["vision_depth"], num_attention_heads=o["vision_heads"],
                  image_size=o["image_size"], patch_size=o["patch_size"], initializer_range=o["vision_init"])
    perceiver = dict(hidden_size=o["d_model"], rms_norm_eps=1e-5, resampler_n_latents=o["n_latents"],
                     resampler_depth=o["resampler_depth"], resampler_n_heads=o["resampler_heads"],
                     resampler_head_dim=o["resampler_head_dim"], num_key_value_heads=o["resampler_kv_heads"])
    return Idefics2Config(text_config=text, vision_config=vision, perceiver_config=perceiver,
                          image_token_id=tokenizer.convert_tokens_to_ids("<image>"), tie_word_embeddings=False)


def tiny_idefics2_model(seed: int = 0, attn_implementation: str = "eager", dtype: torch.dtype = torch.float32,
                        **config_kwargs: Any) -> Idefics2ForConditionalGeneration:
    """A randomly initialised tiny `Idefics2ForConditionalGeneration` (eval mode, norms and biases perturbed,
    random perceiver latents: HF initialises them all to one, which would make every image token alike)."""
    config = tiny_idefics2_config(**config_kwargs)
    config._attn_implementation = attn_implementation
    torch.manual_seed(seed)
    model = Idefics2ForConditionalGeneration(config).eval()
    perturb_norms(model, seed)
    with torch.no_grad():
        latents = model.model.connector.perceiver_resampler.latents
        latents.copy_(torch.randn(latents.shape, generator=torch.Generator().manual_seed(seed + 2)))
    return model.to(dtype)

"""A tiny random Aya Vision (`AyaVisionForConditionalGeneration`: SigLIP tower, pixel shuffle + SwiGLU
projector, Cohere2 decoder) with HF's own `AyaVisionProcessor` around the PIL tiling image processor
(`GotOcr2ImageProcessorPil`: dynamic tiles + a thumbnail), built offline.

The tokenizer is word-level with Aya's special tokens (``<PAD>``, ``<BOS_TOKEN>`` added in front of every
text, the turn tokens, ``<|START_OF_IMG|>``, ``<|END_OF_IMG|>``, ``<|IMG_PATCH|>``) and the words of HF's tile
tags (``TILE_1`` ... and ``TILE_GLOBAL`` are plain text: three tokens each here, ``TILE _ 1``). Tile side,
patch size, pixel-shuffle factor and the tile budget are parameters, so tests pick sizes unlike the released
ones (364 px tiles, 14 px patches, factor 2, up to 12 tiles).
"""

from __future__ import annotations

from typing import Any

import torch
from tokenizers import processors
from transformers import (
    AyaVisionConfig,
    AyaVisionForConditionalGeneration,
    GotOcr2ImageProcessorPil,
    PreTrainedTokenizerFast,
)

from vlens.core.architectures.aya_vision import AyaVisionImageTextProcessor
from vlens.testing.common import TEST_WORDS, perturb_norms
from vlens.testing.gemma3 import gemma_word_tokenizer

AYA_SPECIAL_TOKENS = ["<PAD>", "<unk>", "<BOS_TOKEN>", "<|END_OF_TURN_TOKEN|>", "<|START_OF_TURN_TOKEN|>",
                      "<|USER_TOKEN|>", "<|CHATBOT_TOKEN|>", "<|START_OF_IMG|>", "<|END_OF_IMG|>", "<|IMG_PATCH|>",
                      "<|IMG_LINE_BREAK|>"]
# the text of HF's tile tags: "TILE_{k}" and "TILE_GLOBAL"
AYA_TAG_WORDS = ["TILE", "_", "GLOBAL"]

# Aya Vision's chat format: each image is "<image>" (the processor expands it), then the text
AYA_CHAT_TEMPLATE = (  # the tokenizer adds <BOS_TOKEN>
    "{%- for message in messages -%}"
    "{{ '<|START_OF_TURN_TOKEN|>' }}"
    "{%- if message['role'] == 'user' -%}{{ '<|USER_TOKEN|>' }}{%- else -%}{{ '<|CHATBOT_TOKEN|>' }}{%- endif -%}"
    "{%- if message['content'] is string -%}{{ message['content'] }}"
    "{%- else -%}{%- for item in message['content'] -%}"
    "{%- if item['type'] == 'image' -%}{{ '<image>' }}{%- elif item['type'] == 'text' -%}{{ item['text'] }}"
    "{%- endif -%}{%- endfor -%}{%- endif -%}{{ '<|END_OF_TURN_TOKEN|>' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>' }}{%- endif -%}"
)


def aya_vision_tokenizer(words: list[str] = TEST_WORDS) -> PreTrainedTokenizerFast:
    """An offline word-level tokenizer with Aya Vision's special tokens and tag words, BOS added."""
    backend, vocab = gemma_word_tokenizer(AYA_SPECIAL_TOKENS, [*words, *AYA_TAG_WORDS])
    backend.post_processor = processors.TemplateProcessing(
        single="<BOS_TOKEN> $A", pair="<BOS_TOKEN> $A <BOS_TOKEN> $B",
        special_tokens=[("<BOS_TOKEN>", vocab["<BOS_TOKEN>"])])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", pad_token="<PAD>",
                                        eos_token="<|END_OF_TURN_TOKEN|>", bos_token="<BOS_TOKEN>")
    tokenizer.chat_template = AYA_CHAT_TEMPLATE
    return tokenizer


def tiny_aya_vision_processor(tile: int = 24, patch_size: int = 3, downsample: int = 2, max_patches: int = 4,
                              min_patches: int = 1, tokenizer=None) -> AyaVisionImageTextProcessor:
    """HF's `AyaVisionProcessor` (vlens's subclass that also returns ``image_sizes``) with the PIL tiling image
    processor: each image becomes up to `max_patches` square tiles of `tile` px plus a thumbnail, each tile
    ``(tile // (patch_size * downsample)) ** 2`` ``<|IMG_PATCH|>`` tokens."""
    image_processor = GotOcr2ImageProcessorPil(size={"height": tile, "width": tile}, crop_to_patches=True,
                                               min_patches=min_patches, max_patches=max_patches)
    return AyaVisionImageTextProcessor(image_processor=image_processor, tokenizer=tokenizer or aya_vision_tokenizer(),
                                       patch_size=patch_size, img_size=tile, downsample_factor=downsample,
                                       chat_template=AYA_CHAT_TEMPLATE)


# the sizes and choices `tiny_aya_vision_config` takes by keyword; any other keyword is a Cohere2 config field
AYA_CONFIG_DEFAULTS: dict[str, Any] = dict(
    n_layers=2, d_model=40, n_heads=5, n_kv_heads=1, d_mlp=56, sliding_window=6, sliding_window_pattern=2,
    logit_scale=0.7, tile=24, patch_size=3, downsample=2, vision_depth=2, vision_width=20, vision_heads=2,
    vision_feature_layer=-1, alignment=28)


def tiny_aya_vision_config(tokenizer=None, **overrides: Any) -> AyaVisionConfig:
    """A tiny Aya Vision config whose token ids match `aya_vision_tokenizer`.

    Keywords: those of `AYA_CONFIG_DEFAULTS` (decoder sizes, the sliding window and the pattern of
    sliding / global layers, the logit scale, tile side, patch size, pixel-shuffle factor, SigLIP's sizes,
    the projector's SwiGLU width); any other keyword is a Cohere2 text-config field.
    """
    tokenizer = tokenizer or aya_vision_tokenizer()
    o = {**AYA_CONFIG_DEFAULTS, **{k: v for k, v in overrides.items() if k in AYA_CONFIG_DEFAULTS}}
    layer_types = ["sliding_attention" if (i + 1) % o["sliding_window_pattern"] else "full_attention"
                   for i in range(o["n_layers"])]
    text = dict(model_type="cohere2", vocab_size=len(tokenizer), hidden_size=o["d_model"],
                intermediate_size=o["d_mlp"], num_hidden_layers=o["n_layers"], num_attention_heads=o["n_heads"],
                num_key_value_heads=o["n_kv_heads"], max_position_embeddings=512, layer_norm_eps=1e-5,
                logit_scale=o["logit_scale"], sliding_window=o["sliding_window"], layer_types=layer_types,
                rope_parameters={"rope_type": "default", "rope_theta": 500.0},
                pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                bos_token_id=tokenizer.bos_token_id)
    text.update({k: v for k, v in overrides.items() if k not in AYA_CONFIG_DEFAULTS})
    vision = dict(model_type="siglip_vision_model", hidden_size=o["vision_width"],
                  intermediate_size=2 * o["vision_width"], num_hidden_layers=o["vision_depth"],
                  num_attention_heads=o["vision_heads"], image_size=o["tile"], patch_size=o["patch_size"],
                  vision_use_head=False)
    config = AyaVisionConfig(text_config=text, vision_config=vision, downsample_factor=o["downsample"],
                             image_token_index=tokenizer.convert_tokens_to_ids("<|IMG_PATCH|>"),
                             vision_feature_layer=o["vision_feature_layer"], vision_feature_select_strategy="full")
    config.alignment_intermediate_size = o["alignment"]
    return config


def tiny_aya_vision_model(seed: int = 0, attn_implementation: str = "eager", dtype: torch.dtype = torch.float32,
                          tokenizer=None, **config_kwargs: Any) -> AyaVisionForConditionalGeneration:
    """A randomly initialised tiny `AyaVisionForConditionalGeneration` (eval mode, norms perturbed). Stops at
    ``<|END_OF_TURN_TOKEN|>``."""
    config = tiny_aya_vision_config(tokenizer=tokenizer, **config_kwargs)
    config._attn_implementation = attn_implementation
    torch.manual_seed(seed)
    model = AyaVisionForConditionalGeneration(config).to(dtype).eval()  # type: ignore[arg-type]
    perturb_norms(model, seed)
    model.generation_config.eos_token_id = config.get_text_config().eos_token_id
    return model

"""A tiny random InternVL (`InternVLForConditionalGeneration`: InternViT, pixel shuffle, MLP projector,
Qwen2 or Llama decoder) with HF's processor (image-only, no torchvision: `InternVLImageTextProcessor`)
around the PIL `GotOcr2ImageProcessorPil` (dynamic tiles + thumbnail), built offline.

Tile side, patch size, downsample ratio and the tile budget are parameters, so tests can pick sizes
unlike the released ones (448 px tiles, 14 px patches, ratio 0.5, up to 12 tiles).
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import (
    GotOcr2ImageProcessorPil,
    InternVLConfig,
    InternVLForConditionalGeneration,
    PreTrainedTokenizerFast,
)

from vlens.core.architectures.internvl import InternVLImageTextProcessor
from vlens.testing.common import TEST_WORDS, perturb_norms, word_level_tokenizer

INTERNVL_SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<img>", "</img>", "<IMG_CONTEXT>",
                           "<video>"]
# the named tokens HF's InternVL processor reads from the tokenizer
INTERNVL_NAMED_TOKENS = {"start_image_token": "<img>", "end_image_token": "</img>",
                         "context_image_token": "<IMG_CONTEXT>", "video_token": "<video>"}
# OpenGVLab/InternVL3-*-hf's chat format: each image is "<IMG_CONTEXT>\n" before the text
INTERNVL_CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for item in message['content'] %}{% if item['type'] == 'image' %}{{ '<IMG_CONTEXT>\n' }}"
    "{% elif item['type'] == 'text' %}{{ item['text'] }}{% endif %}{% endfor %}{% endif %}"
    "{{ '<|im_end|>\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def internvl_tokenizer() -> PreTrainedTokenizerFast:
    """An offline word-level tokenizer with InternVL's specials (``<img>``, ``</img>``, ``<IMG_CONTEXT>``
    named as HF's processor expects), ``<|im_end|>`` as EOS and the InternVL3 chat template."""
    tokenizer = word_level_tokenizer(words=list(TEST_WORDS), specials=INTERNVL_SPECIAL_TOKENS,
                                     pad_token="<|endoftext|>", eos_token="<|im_end|>",
                                     extra_special_tokens=INTERNVL_NAMED_TOKENS)
    tokenizer.chat_template = INTERNVL_CHAT_TEMPLATE
    return tokenizer


def tiny_internvl_processor(tile: int = 32, patch_size: int = 8, downsample_ratio: float = 0.5,
                            max_patches: int = 6, min_patches: int = 1, tokenizer=None) -> InternVLImageTextProcessor:
    """HF's InternVL processor (image-only) with the PIL tiling image processor.

    Each image becomes up to `max_patches` square tiles of `tile` px (+ a thumbnail), each tile
    ``(tile // patch_size * downsample_ratio) ** 2`` tokens.
    """
    image_processor = GotOcr2ImageProcessorPil(size={"height": tile, "width": tile}, crop_to_patches=True,
                                               min_patches=min_patches, max_patches=max_patches)
    per_tile = int(tile // patch_size * downsample_ratio) ** 2
    return InternVLImageTextProcessor(image_processor=image_processor, tokenizer=tokenizer or internvl_tokenizer(),
                                      image_seq_length=per_tile, chat_template=INTERNVL_CHAT_TEMPLATE)


# the sizes and choices `tiny_internvl_config` takes by keyword; any other keyword is a text-config field
INTERNVL_CONFIG_DEFAULTS: dict[str, Any] = dict(
    n_layers=2, d_model=48, n_heads=4, n_kv_heads=2, d_mlp=80, text_model="qwen2", tie_word_embeddings=True,
    tile=32, patch_size=8, downsample_ratio=0.5, vision_feature_layer=-1, vision_depth=3, vision_width=24,
    vision_heads=3, norm_type="layer_norm", use_qk_norm=False, use_mean_pooling=True)


def tiny_internvl_config(tokenizer=None, **overrides: Any) -> InternVLConfig:
    """A tiny InternVL config whose token ids match `internvl_tokenizer`.

    Keywords: those of `INTERNVL_CONFIG_DEFAULTS` (decoder sizes, `text_model` "qwen2" / "llama" /
    "qwen3", tile side, patch size, downsample ratio, InternViT's sizes and options); any other keyword
    is a field of the text config (``head_dim=12``).
    """
    tokenizer = tokenizer or internvl_tokenizer()
    o = {**INTERNVL_CONFIG_DEFAULTS, **{k: v for k, v in overrides.items() if k in INTERNVL_CONFIG_DEFAULTS}}
    text = dict(model_type=o["text_model"], vocab_size=len(tokenizer), hidden_size=o["d_model"],
                intermediate_size=o["d_mlp"], num_hidden_layers=o["n_layers"], num_attention_heads=o["n_heads"],
                num_key_value_heads=o["n_kv_heads"], max_position_embeddings=1024, rms_norm_eps=1e-5,
                pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                tie_word_embeddings=o["tie_word_embeddings"])
    text.update({k: v for k, v in overrides.items() if k not in INTERNVL_CONFIG_DEFAULTS})
    vision = dict(hidden_size=o["vision_width"], num_hidden_layers=o["vision_depth"],
                  num_attention_heads=o["vision_heads"], intermediate_size=2 * o["vision_width"],
                  image_size=o["tile"], patch_size=o["patch_size"], norm_type=o["norm_type"],
                  use_qk_norm=o["use_qk_norm"], use_mean_pooling=o["use_mean_pooling"], attention_bias=True)
    return InternVLConfig(text_config=text, vision_config=vision,
                          image_token_id=tokenizer.convert_tokens_to_ids("<IMG_CONTEXT>"),
                          image_seq_length=int(o["tile"] // o["patch_size"] * o["downsample_ratio"]) ** 2,
                          downsample_ratio=o["downsample_ratio"], vision_feature_layer=o["vision_feature_layer"],
                          tie_word_embeddings=o["tie_word_embeddings"])


def perturb_internvl(model: torch.nn.Module, seed: int) -> None:
    """HF initialises InternViT's CLS token and position embeddings to zero and its layer scales to a
    constant; randomise them (and every norm and bias) so parity tests see them."""
    perturb_norms(model, seed)
    generator = torch.Generator().manual_seed(seed + 2)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(("cls_token", "position_embeddings", "lambda_1", "lambda_2")) or \
                    ("vision_tower" in name and name.endswith("norm.weight")):
                param.add_(0.2 * torch.randn(param.shape, generator=generator).to(param.dtype))


def tiny_internvl_model(seed: int = 0, attn_implementation: str = "eager", dtype: torch.dtype = torch.float32,
                        **config_kwargs: Any) -> InternVLForConditionalGeneration:
    """A randomly initialised tiny `InternVLForConditionalGeneration` (eval mode, every parameter random)."""
    config = tiny_internvl_config(**config_kwargs)
    config._attn_implementation = attn_implementation
    torch.manual_seed(seed)
    # HF wraps Module.to with functools.wraps: mypy reads the unbound signature (self first)
    model = InternVLForConditionalGeneration(config).to(dtype).eval()  # type: ignore[arg-type]
    perturb_internvl(model, seed)
    return model

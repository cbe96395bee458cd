"""A tiny random LFM2-VL (`Lfm2VlForConditionalGeneration`: SigLIP2 NaFlex tower, pixel-unshuffle projector,
LFM2's hybrid decoder of short convolutions and attention) with vlens's torchvision-free processor, built offline.

The tokenizer is word-level with LFM2-VL's special tokens (`<|pad|>`, `<|startoftext|>`, `<|im_start|>`,
`<|im_end|>`, `<image>`, `<|image_start|>`, `<|image_end|>`, `<|img_thumbnail|>` and the `<|img_row_r_col_c|>`
tile tags) and a ChatML template; the image processor is `Lfm2VlImageProcessorPil` with tiny tiles.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import Lfm2VlConfig, Lfm2VlForConditionalGeneration, PreTrainedTokenizerFast

from vlens.core.architectures.lfm2_vl_processor import Lfm2VlImageProcessorPil, Lfm2VlImageTextProcessor
from vlens.testing.common import TEST_WORDS, perturb_norms, word_level_tokenizer

LFM2_VL_SPECIAL_TOKENS = ["<|pad|>", "<|startoftext|>", "<|im_start|>", "<|im_end|>", "<image>", "<|image_start|>",
                          "<|image_end|>", "<|img_thumbnail|>",
                          *[f"<|img_row_{r}_col_{c}|>" for r in range(1, 5) for c in range(1, 5)]]

# LFM2's ChatML format
LFM2_VL_CHAT_TEMPLATE = (
    "<|startoftext|>"
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for item in message['content'] %}"
    "{% if item['type'] == 'image' %}<image>{% elif item['type'] == 'text' %}{{ item['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def lfm2_vl_tokenizer(words: list[str] = TEST_WORDS) -> PreTrainedTokenizerFast:
    """An offline word-level tokenizer with LFM2-VL's special tokens (the tile tags up to 4 x 4)."""
    tokenizer = word_level_tokenizer(words, specials=LFM2_VL_SPECIAL_TOKENS, pad_token="<|pad|>",
                                     eos_token="<|im_end|>", bos_token="<|startoftext|>")
    tokenizer.chat_template = LFM2_VL_CHAT_TEMPLATE
    return tokenizer


def tiny_lfm2_vl_processor(patch_size: int = 4, factor: int = 2, tile_size: int = 16, min_image_tokens: int = 2,
                           max_image_tokens: int = 6, max_tiles: int = 4, use_thumbnail: bool = True,
                           tokenizer=None) -> Lfm2VlImageTextProcessor:
    """vlens's torchvision-free `Lfm2VlProcessor`: an image small enough for `max_image_tokens` (twice that in
    pixels) is one tile resized whole; a larger one is cut into 2..`max_tiles` tiles of `tile_size` px plus a
    thumbnail."""
    image_processor = Lfm2VlImageProcessorPil(downsample_factor=factor, encoder_patch_size=patch_size,
                                              tile_size=tile_size, min_image_tokens=min_image_tokens,
                                              max_image_tokens=max_image_tokens, min_tiles=2, max_tiles=max_tiles,
                                              use_thumbnail=use_thumbnail)
    return Lfm2VlImageTextProcessor(tokenizer or lfm2_vl_tokenizer(), image_processor,
                                    chat_template=LFM2_VL_CHAT_TEMPLATE)


def tiny_lfm2_vl_config(n_layers: int = 3, d_model: int = 40, n_heads: int = 4, n_kv_heads: int = 2,
                        d_mlp: int = 56, full_attn_idxs: tuple[int, ...] = (0, 2), conv_kernel: int = 3,
                        conv_bias: bool = False, patch_size: int = 4, factor: int = 2, vision_depth: int = 2,
                        vision_width: int = 24, vision_heads: int = 2, position_grid: int = 4,
                        projector_use_layernorm: bool = True, tokenizer=None, **overrides: Any) -> Lfm2VlConfig:
    """A tiny LFM2-VL config whose token ids match `lfm2_vl_tokenizer`.

    Layers are short convolutions except `full_attn_idxs` (attention); d_head = d_model / n_heads (LFM2 has no
    head_dim), grouped KV heads. `overrides`: text-config fields, or the top-level ``projector_hidden_size`` /
    ``projector_bias`` / ``projector_hidden_act``.
    """
    tokenizer = tokenizer or lfm2_vl_tokenizer()
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in ("<|pad|>", "<|startoftext|>", "<|im_end|>", "<image>")}
    top = {k: overrides.pop(k) for k in ("projector_hidden_size", "projector_bias", "projector_hidden_act")
           if k in overrides}
    text = dict(model_type="lfm2", vocab_size=len(tokenizer), hidden_size=d_model, intermediate_size=d_mlp,
                block_auto_adjust_ff_dim=False, num_hidden_layers=n_layers, num_attention_heads=n_heads,
                num_key_value_heads=n_kv_heads, max_position_embeddings=512, norm_eps=1e-5,
                conv_L_cache=conv_kernel, conv_bias=conv_bias,
                layer_types=["full_attention" if i in full_attn_idxs else "conv" for i in range(n_layers)],
                rope_parameters={"rope_type": "default", "rope_theta": 900.0},
                pad_token_id=ids["<|pad|>"], eos_token_id=ids["<|im_end|>"], bos_token_id=ids["<|startoftext|>"])
    text.update(overrides)
    vision = dict(model_type="siglip2_vision_model", hidden_size=vision_width, intermediate_size=2 * vision_width - 4,
                  num_hidden_layers=vision_depth, num_attention_heads=vision_heads, patch_size=patch_size,
                  num_patches=position_grid ** 2, vision_use_head=False)
    top.setdefault("projector_hidden_size", 3 * d_model // 2)
    return Lfm2VlConfig(text_config=text, vision_config=vision, image_token_id=ids["<image>"],
                        downsample_factor=factor, projector_use_layernorm=projector_use_layernorm, **top)


def tiny_lfm2_vl_model(seed: int = 0, attn_implementation: str = "eager", dtype: torch.dtype = torch.float32,
                       tokenizer=None, **config_kwargs: Any) -> Lfm2VlForConditionalGeneration:
    """A randomly initialised tiny `Lfm2VlForConditionalGeneration` (eval mode, norms and conv weights perturbed).
    Stops at `<|im_end|>`."""
    config = tiny_lfm2_vl_config(tokenizer=tokenizer, **config_kwargs)
    config._attn_implementation = attn_implementation
    torch.manual_seed(seed)
    model = Lfm2VlForConditionalGeneration(config).to(dtype).eval()  # type: ignore[arg-type]
    perturb_norms(model, seed)
    generator = torch.Generator().manual_seed(seed + 2)
    with torch.no_grad():  # random init leaves the position embeddings small: make every position count
        for name, param in model.named_parameters():
            if name.endswith("operator_norm.weight") or name.endswith("ffn_norm.weight") or \
                    name.endswith("embedding_norm.weight") or name.endswith("position_embedding.weight"):
                param.add_(0.1 * torch.randn(param.shape, generator=generator).to(param.dtype))
    model.generation_config.eos_token_id = config.get_text_config().eos_token_id
    return model

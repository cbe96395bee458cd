"""A tiny random Molmo 2 (`Molmo2ForConditionalGeneration`: ViT over overlapping crops, attention-pooling adapter,
Qwen3 decoder with a bidirectional image block) with vlens's torchvision-free processor, built offline.

The tokenizer is word-level with Qwen's chat tokens and `<|image|>`; the image tokens (`<im_patch>`, `<im_col>`,
`<im_start>`, `<low_res_im_start>`, `<im_end>`, ...) come after the words, in the embedding's additional
vocabulary past the LM head's outputs, as in the real checkpoints.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import Molmo2Config, Molmo2ForConditionalGeneration, PreTrainedTokenizerFast

from vlens.core.architectures.molmo2_processor import (
    IMAGE_TOKENS,
    Molmo2ImageProcessorTorch,
    Molmo2ImageTextProcessor,
)
from vlens.testing.common import TEST_WORDS, perturb_norms, word_level_tokenizer

MOLMO2_SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|image|>", "<|video|>"]

MOLMO2_CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for item in message['content'] %}"
    "{% if item['type'] == 'image' %}<|image|>{% elif item['type'] == 'text' %}{{ item['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def molmo2_tokenizer(words: list[str] = TEST_WORDS) -> PreTrainedTokenizerFast:
    """An offline word-level tokenizer: Qwen's chat tokens, the words, then Molmo 2's image tokens (the additional
    vocabulary: ids from `base_vocab_size(tokenizer)` on)."""
    tokenizer = word_level_tokenizer(words, specials=MOLMO2_SPECIAL_TOKENS, pad_token="<|endoftext|>",
                                     eos_token="<|im_end|>")
    tokenizer.add_tokens(list(IMAGE_TOKENS), special_tokens=True)
    tokenizer.chat_template = MOLMO2_CHAT_TEMPLATE
    return tokenizer


def tiny_molmo2_processor(crop: int = 16, patch_size: int = 4, margins: tuple[int, int] = (1, 1),
                          pooling: tuple[int, int] = (2, 2), max_crops: int = 4,
                          tokenizer=None) -> Molmo2ImageTextProcessor:
    """vlens's torchvision-free `Molmo2Processor`: a `crop` px low-res view and up to `max_crops` overlapping crops
    (`margins` patches of overlap), pooled in `pooling` windows of patches."""
    image_processor = Molmo2ImageProcessorTorch(size=crop, max_crops=max_crops, overlap_margins=margins,
                                                patch_size=patch_size, pooling_size=pooling)
    return Molmo2ImageTextProcessor(tokenizer or molmo2_tokenizer(), image_processor,
                                    chat_template=MOLMO2_CHAT_TEMPLATE)


def tiny_molmo2_config(n_layers: int = 2, d_model: int = 40, n_heads: int = 4, n_kv_heads: int = 2, d_head: int = 12,
                       d_mlp: int = 56, attention_bias: bool = True, crop: int = 16, patch_size: int = 4,
                       vision_depth: int = 3, vision_width: int = 24, vision_heads: int = 2,
                       feature_layers: tuple[int, ...] = (-1, -3), adapter_heads: int = 3,
                       tokenizer=None, **overrides: Any) -> Molmo2Config:
    """A tiny Molmo 2 config whose token ids match `molmo2_tokenizer` (its image tokens in the additional vocabulary).

    d_head != d_model / n_heads, grouped KV heads, q/k/v biases; a 3-layer ViT whose last and first layer feed the
    adapter. `overrides`: text-config fields (``rope_parameters``, ``rope_scaling_layers``, ``qk_norm_type``, ...).
    """
    tokenizer = tokenizer or molmo2_tokenizer()
    init = {"initializer_range": overrides.pop("initializer_range")} if "initializer_range" in overrides else {}
    base = len(tokenizer) - len(IMAGE_TOKENS)
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in (*IMAGE_TOKENS, "<|endoftext|>", "<|im_end|>")}
    text = dict(hidden_size=d_model, num_attention_heads=n_heads, num_key_value_heads=n_kv_heads, head_dim=d_head,
                vocab_size=base, additional_vocab_size=len(IMAGE_TOKENS) + 2, attention_bias=attention_bias,
                qk_norm_type="qwen3", num_hidden_layers=n_layers, intermediate_size=d_mlp, hidden_act="silu",
                max_position_embeddings=512, rope_parameters={"rope_type": "default", "rope_theta": 600.0},
                rms_norm_eps=1e-5, pad_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|im_end|>"])
    text.update(overrides, **init)
    vision = dict(hidden_size=vision_width, intermediate_size=2 * vision_width - 6, num_hidden_layers=vision_depth,
                  num_attention_heads=vision_heads, num_key_value_heads=vision_heads,
                  head_dim=vision_width // vision_heads, image_size=[crop, crop], patch_size=patch_size,
                  hidden_act="gelu_pytorch_tanh", layer_norm_eps=1e-6, **init)
    adapter = dict(vision_feature_layer=list(feature_layers), hidden_size=vision_width,
                   num_attention_heads=adapter_heads, num_key_value_heads=adapter_heads, head_dim=8,
                   intermediate_size=44, text_hidden_size=d_model, hidden_act="silu", **init)
    return Molmo2Config(vision_config=vision, adapter_config=adapter, text_config=text,
                        image_start_token_id=ids["<im_start>"], low_res_image_start_token_id=ids["<low_res_im_start>"],
                        image_end_token_id=ids["<im_end>"], image_patch_id=ids["<im_patch>"],
                        frame_start_token_id=ids["<frame_start>"], frame_end_token_id=ids["<frame_end>"], **init)


def tiny_molmo2_model(seed: int = 0, attn_implementation: str = "eager", dtype: torch.dtype = torch.float32,
                      tokenizer=None, **config_kwargs: Any) -> Molmo2ForConditionalGeneration:
    """A randomly initialised tiny `Molmo2ForConditionalGeneration` (eval mode, norms, biases and positional
    embeddings perturbed). Stops at `<|im_end|>`."""
    config = tiny_molmo2_config(tokenizer=tokenizer, **config_kwargs)
    config._attn_implementation = attn_implementation
    torch.manual_seed(seed)
    model = Molmo2ForConditionalGeneration(config).to(dtype).eval()  # type: ignore[arg-type]
    perturb_norms(model, seed)
    generator = torch.Generator().manual_seed(seed + 2)
    with torch.no_grad():  # zero-initialised: make every position count
        positional = model.model.vision_tower.positional_embedding
        positional.add_(0.5 * torch.randn(positional.shape, generator=generator).to(positional.dtype))
        for param in model.model.multi_modal_projector.parameters():  # so that image edits move the logits
            param.mul_(4.0)
    model.generation_config.eos_token_id = config.get_text_config().eos_token_id
    return model

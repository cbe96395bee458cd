"""A tiny random Phi-4-multimodal (`Phi4MultimodalForCausalLM`: SigLIP over a global view and HD crops, 2 x 2
pooling, newline / separator feature tokens, a Phi-3 decoder with fused qkv / gate-up projections and partial
rotary) with vlens's torchvision-free processor, built offline.

The tokenizer is word-level with Phi-4's chat tokens (`<|endoftext|>`, `<|user|>`, `<|assistant|>`, `<|end|>`,
`<|system|>`) and its `<|image|>` / `<|audio|>` placeholders; the image processor is
`Phi4MultimodalImageProcessorTorch` with tiny crops.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import Phi4MultimodalConfig, Phi4MultimodalForCausalLM, PreTrainedTokenizerFast

from vlens.core.architectures.phi4_multimodal_processor import (
    Phi4MultimodalImageProcessorTorch,
    Phi4MultimodalImageTextProcessor,
)
from vlens.testing.common import TEST_WORDS, perturb_norms, word_level_tokenizer

PHI4_MULTIMODAL_SPECIAL_TOKENS = ["<|endoftext|>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>", "<|image|>",
                                  "<|audio|>"]

# Phi-4's chat format: <|user|>...<|end|><|assistant|>
PHI4_MULTIMODAL_CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for item in message['content'] %}"
    "{% if item['type'] == 'image' %}<|image|>{% elif item['type'] == 'text' %}{{ item['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def phi4_multimodal_tokenizer(words: list[str] = TEST_WORDS) -> PreTrainedTokenizerFast:
    """An offline word-level tokenizer with Phi-4-multimodal's chat tokens and placeholders."""
    tokenizer = word_level_tokenizer(words, specials=PHI4_MULTIMODAL_SPECIAL_TOKENS, pad_token="<|endoftext|>",
                                     eos_token="<|end|>")
    tokenizer.chat_template = PHI4_MULTIMODAL_CHAT_TEMPLATE
    return tokenizer


def tiny_phi4_multimodal_processor(crop_size: int = 16, patch_size: int = 4, dynamic_hd: int = 4,
                                   tokenizer=None) -> Phi4MultimodalImageTextProcessor:
    """vlens's torchvision-free `Phi4MultimodalProcessor` with `crop_size` px crops of `patch_size` px patches and
    at most `dynamic_hd` crops per image (plus the global view)."""
    image_processor = Phi4MultimodalImageProcessorTorch(size=crop_size, patch_size=patch_size, dynamic_hd=dynamic_hd)
    return Phi4MultimodalImageTextProcessor(tokenizer or phi4_multimodal_tokenizer(), image_processor,
                                            chat_template=PHI4_MULTIMODAL_CHAT_TEMPLATE)


def tiny_phi4_multimodal_config(n_layers: int = 2, d_model: int = 40, n_heads: int = 4, n_kv_heads: int = 2,
                                d_mlp: int = 56, partial_rotary_factor: float = 0.6, rope_theta: float = 500.0,
                                crop_size: int = 16, patch_size: int = 4, vision_depth: int = 3,
                                vision_width: int = 24, vision_heads: int = 2, feature_layer: int = -2,
                                tokenizer=None, **overrides: Any) -> Phi4MultimodalConfig:
    """A tiny Phi-4-multimodal config whose token ids match `phi4_multimodal_tokenizer` (the audio encoder is
    tiny too: vlens never runs it). `overrides`: top-level config fields."""
    tokenizer = tokenizer or phi4_multimodal_tokenizer()
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in ("<|endoftext|>", "<|end|>", "<|image|>", "<|audio|>")}
    settings: dict[str, Any] = dict(
        vocab_size=len(tokenizer), hidden_size=d_model, intermediate_size=d_mlp, num_hidden_layers=n_layers,
        num_attention_heads=n_heads, num_key_value_heads=n_kv_heads, max_position_embeddings=512,
        original_max_position_embeddings=512, pad_token_id=ids["<|endoftext|>"], bos_token_id=ids["<|endoftext|>"],
        eos_token_id=[ids["<|end|>"]],
        rope_parameters={"rope_type": "default", "rope_theta": rope_theta, "partial_rotary_factor": partial_rotary_factor},
        vision_config=dict(hidden_size=vision_width, intermediate_size=2 * vision_width - 8,
                           num_hidden_layers=vision_depth, num_attention_heads=vision_heads, image_size=crop_size,
                           patch_size=patch_size, crop_size=crop_size, image_token_id=ids["<|image|>"],
                           feature_layer=feature_layer),
        audio_config=dict(hidden_size=16, intermediate_size=16, num_blocks=1, num_attention_heads=2,
                          ext_pw_out_channel=16, depthwise_separable_out_channel=16, nemo_conv_channels=16,
                          input_size=8, audio_token_id=ids["<|audio|>"]))
    settings.update(overrides)
    return Phi4MultimodalConfig(**settings)


def tiny_phi4_multimodal_model(seed: int = 0, attn_implementation: str = "eager", dtype: torch.dtype = torch.float32,
                               tokenizer=None, **config_kwargs: Any) -> Phi4MultimodalForCausalLM:
    """A randomly initialised tiny `Phi4MultimodalForCausalLM` (eval mode; norms, the newline / separator
    features and the position embeddings perturbed so that each counts). Stops at `<|end|>`."""
    config = tiny_phi4_multimodal_config(tokenizer=tokenizer, **config_kwargs)
    config._attn_implementation = attn_implementation
    torch.manual_seed(seed)
    model = Phi4MultimodalForCausalLM(config).to(dtype).eval()  # type: ignore[arg-type]
    perturb_norms(model, seed)
    generator = torch.Generator().manual_seed(seed + 3)
    embed = model.model.embed_tokens_extend.image_embed
    with torch.no_grad():  # HF initialises the newline / separator features at zero
        for param in (embed.global_img_feature_extensor, embed.sub_img_feature_extensor,
                      embed.img_processor.embeddings.position_embedding.weight):
            param.add_(torch.randn(param.shape, generator=generator).to(param.dtype))
    model.generation_config.eos_token_id = config.eos_token_id
    return model

"""Tiny random GLM-4V models (GLM-4.1V: `Glm4vForConditionalGeneration`; GLM-4.5V: `Glm4vMoeForConditionalGeneration`)
with vlens's `SimpleVLProcessor` around HF's PIL `Glm4vImageProcessorPil`, built offline.

GLM-4V's decoder has four norms per block, a fused gate/up MLP, q/k/v biases and 3-D rotary (M-RoPE
sections over t / h / w) on a fraction of each head's dimensions, rotating adjacent pairs; its tower
is a Qwen2-VL-style ViT (2-D rotary, 2 x 2 merge through a conv, patch merger). Patch size, merge size,
rotary fraction and sections are parameters, so tests can pick sizes unlike the released ones.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import (
    Glm4vConfig,
    Glm4vForConditionalGeneration,
    Glm4vImageProcessorPil,
    Glm4vMoeConfig,
    Glm4vMoeForConditionalGeneration,
    PreTrainedTokenizerFast,
)

from vlens.core.processors import SimpleVLProcessor
from vlens.testing.common import TEST_WORDS, perturb_norms, word_level_tokenizer
from vlens.testing.qwen3_vl_moe import sharpen_routers

GLM4V_SPECIAL_TOKENS = ["<|endoftext|>", "[gMASK]", "<sop>", "<|user|>", "<|assistant|>", "<|begin_of_image|>",
                        "<|image|>", "<|end_of_image|>", "<|begin_of_video|>", "<|video|>", "<|end_of_video|>"]
# zai-org/GLM-4.1V-9B-Thinking's chat format (without the system / thinking parts)
GLM4V_CHAT_TEMPLATE = (
    "[gMASK]<sop>{% for message in messages %}<|{{ message['role'] }}|>\n"
    "{% for line in message['content'] %}{% if line['type'] == 'text' %}{{ line['text'] }}"
    "{% elif line['type'] == 'image' %}<|begin_of_image|><|image|><|end_of_image|>{% endif %}{% endfor %}"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def glm4v_tokenizer() -> PreTrainedTokenizerFast:
    """An offline word-level tokenizer with GLM-4V's specials and chat template (EOS ``<|endoftext|>``)."""
    tokenizer = word_level_tokenizer(words=TEST_WORDS, specials=GLM4V_SPECIAL_TOKENS, pad_token="<|endoftext|>",
                                     eos_token="<|endoftext|>", keep_newlines=True)
    tokenizer.chat_template = GLM4V_CHAT_TEMPLATE
    return tokenizer


def tiny_glm4v_processor(patch_size: int = 6, merge_size: int = 2, min_pixels: int = 24 * 24,
                         max_pixels: int = 60 * 60, tokenizer=None) -> SimpleVLProcessor:
    """`SimpleVLProcessor` (GLM's ``<|image|>`` expanded to the image's merged tokens) around HF's PIL
    image processor, images resized to multiples of patch_size x merge_size within [min, max] pixels."""
    image_processor = Glm4vImageProcessorPil(size={"shortest_edge": min_pixels, "longest_edge": max_pixels},
                                             patch_size=patch_size, merge_size=merge_size, temporal_patch_size=2)
    tokenizer = tokenizer or glm4v_tokenizer()
    return SimpleVLProcessor(tokenizer, image_processor, chat_template=GLM4V_CHAT_TEMPLATE, image_token="<|image|>")


# the sizes `tiny_glm4v_config` takes by keyword; any other keyword is a field of the text config
GLM4V_CONFIG_DEFAULTS: dict[str, Any] = dict(
    n_layers=2, d_model=64, n_heads=4, n_kv_heads=2, d_mlp=72, partial_rotary_factor=0.5, mrope_section=None,
    patch_size=6, merge_size=2, vision_depth=2, vision_width=24, vision_heads=3, vision_image_size=36, vision_init=0.1)


def tiny_glm4v_text_and_vision(tokenizer=None, **overrides: Any) -> tuple[dict, dict, dict]:
    """(text config, vision config, token ids) of a tiny GLM-4V; see `tiny_glm4v_config`."""
    tokenizer = tokenizer or glm4v_tokenizer()
    o = {**GLM4V_CONFIG_DEFAULTS, **{k: v for k, v in overrides.items() if k in GLM4V_CONFIG_DEFAULTS}}
    d_head = o["d_model"] // o["n_heads"]
    pairs = int(d_head * o["partial_rotary_factor"]) // 2
    section = o["mrope_section"] or [pairs - 2 * (pairs // 3), pairs // 3, pairs // 3]
    text = dict(vocab_size=len(tokenizer), hidden_size=o["d_model"], intermediate_size=o["d_mlp"],
                num_hidden_layers=o["n_layers"], num_attention_heads=o["n_heads"], num_key_value_heads=o["n_kv_heads"],
                max_position_embeddings=1024, rms_norm_eps=1e-5, pad_token_id=tokenizer.pad_token_id,
                eos_token_id=tokenizer.eos_token_id,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": section,
                                 "partial_rotary_factor": o["partial_rotary_factor"]})
    text.update({k: v for k, v in overrides.items() if k not in GLM4V_CONFIG_DEFAULTS})
    vision = dict(depth=o["vision_depth"], hidden_size=o["vision_width"], intermediate_size=2 * o["vision_width"],
                  num_heads=o["vision_heads"], patch_size=o["patch_size"], spatial_merge_size=o["merge_size"],
                  temporal_patch_size=2, out_hidden_size=o["d_model"], image_size=o["vision_image_size"],
                  rms_norm_eps=1e-5, initializer_range=o["vision_init"])
    ids = {name: tokenizer.convert_tokens_to_ids(token) for name, token in (
        ("image_token_id", "<|image|>"), ("video_token_id", "<|video|>"), ("image_start_token_id", "<|begin_of_image|>"),
        ("image_end_token_id", "<|end_of_image|>"), ("video_start_token_id", "<|begin_of_video|>"),
        ("video_end_token_id", "<|end_of_video|>"))}
    return text, vision, ids


def tiny_glm4v_config(tokenizer=None, **overrides: Any) -> Glm4vConfig:
    """A tiny GLM-4.1V config whose token ids match `glm4v_tokenizer`.

    Keywords: those of `GLM4V_CONFIG_DEFAULTS` (decoder sizes; d_head is d_model / n_heads, as GLM's
    attention makes it; the rotary fraction and M-RoPE sections, which sum to the rotated pairs; patch
    and merge size, the tower's sizes and init std, wider than HF's 0.02 so that an edit inside the tiny
    tower still shows in the logits); any other keyword is a field of the text config.
    """
    text, vision, ids = tiny_glm4v_text_and_vision(tokenizer, **overrides)
    return Glm4vConfig(text_config=text, vision_config=vision, tie_word_embeddings=False, **ids)


def finish_glm4v(model, seed: int, dtype: torch.dtype):
    """Eval mode, perturbed norms and biases, `dtype`; returns the model."""
    model.eval()
    perturb_norms(model, seed)
    return model.to(dtype)


def tiny_glm4v_model(seed: int = 0, attn_implementation: str = "eager", dtype: torch.dtype = torch.float32,
                     **config_kwargs: Any) -> Glm4vForConditionalGeneration:
    """A randomly initialised tiny `Glm4vForConditionalGeneration` (eval mode, norms and biases perturbed)."""
    config = tiny_glm4v_config(**config_kwargs)
    config._attn_implementation = attn_implementation
    torch.manual_seed(seed)
    return finish_glm4v(Glm4vForConditionalGeneration(config), seed, dtype)


# tiny_glm4v_moe_config's MoE keywords and their defaults
GLM4V_MOE_DEFAULTS: dict[str, Any] = {
    "n_experts": 8, "top_k": 2, "d_expert": 20, "n_shared_experts": 1, "n_group": 2, "topk_group": 1,
    "first_k_dense_replace": 1, "routed_scaling_factor": 1.5, "norm_topk_prob": True, "attention_bias": True,
}


def tiny_glm4v_moe_config(tokenizer=None, head_dim: int | None = None, **overrides: Any) -> Glm4vMoeConfig:
    """A tiny GLM-4.5V config: `tiny_glm4v_config`'s keywords (decoder and tower sizes, rotary fraction and
    sections) plus the MoE keywords of GLM4V_MOE_DEFAULTS: `n_experts` routed experts of size `d_expert` in
    `n_group` groups (`topk_group` kept), `top_k` per token, `n_shared_experts`, dense MLPs on the first
    `first_k_dense_replace` layers, `routed_scaling_factor`, `norm_topk_prob`, `attention_bias`; head_dim free."""
    moe = {name: overrides.pop(name, default) for name, default in GLM4V_MOE_DEFAULTS.items()}
    if head_dim is not None and "mrope_section" not in overrides:  # the sections cover the rotated pairs of head_dim
        pairs = int(head_dim * overrides.get("partial_rotary_factor", GLM4V_CONFIG_DEFAULTS["partial_rotary_factor"])) // 2
        overrides["mrope_section"] = [pairs - 2 * (pairs // 3), pairs // 3, pairs // 3]
    text, vision, ids = tiny_glm4v_text_and_vision(tokenizer, **overrides)
    text.update(n_routed_experts=moe["n_experts"], num_experts_per_tok=moe["top_k"],
                moe_intermediate_size=moe["d_expert"], n_shared_experts=moe["n_shared_experts"],
                n_group=moe["n_group"], topk_group=moe["topk_group"],
                first_k_dense_replace=moe["first_k_dense_replace"],
                routed_scaling_factor=moe["routed_scaling_factor"], norm_topk_prob=moe["norm_topk_prob"],
                attention_bias=moe["attention_bias"])
    if head_dim is not None:
        text["head_dim"] = head_dim
    return Glm4vMoeConfig(text_config=text, vision_config=vision, tie_word_embeddings=False, **ids)


def tiny_glm4v_moe_model(seed: int = 0, attn_implementation: str = "eager", dtype: torch.dtype = torch.float32,
                         **config_kwargs: Any) -> Glm4vMoeForConditionalGeneration:
    """A randomly initialised tiny `Glm4vMoeForConditionalGeneration` (eval mode, norms and biases perturbed,
    routers and experts redrawn so that routing is decisive and varied, random choice biases)."""
    config = tiny_glm4v_moe_config(**config_kwargs)
    config._attn_implementation = attn_implementation
    config._experts_implementation = "eager"
    torch.manual_seed(seed)
    model = Glm4vMoeForConditionalGeneration(config)
    sharpen_routers(model, seed)
    generator = torch.Generator().manual_seed(seed + 3)
    with torch.no_grad():
        for name, buffer in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                buffer.copy_(0.1 * torch.randn(buffer.shape, generator=generator))
    return finish_glm4v(model, seed, dtype)

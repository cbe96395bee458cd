"""Tiny random Qwen3.5-MoE models (Qwen3.5's hybrid decoder, sparse MoE MLP with a shared expert), offline.

The processor is Qwen3-VL's (`tiny_qwen3_vl_processor`).
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import Qwen3_5MoeConfig, Qwen3_5MoeForConditionalGeneration

from vlens.testing.qwen3_5 import finish_tiny, qwen3_5_text_config, qwen3_5_vision_config, special_token_ids
from vlens.testing.qwen3_vl_moe import build_tiny_moe


def tiny_qwen3_5_moe_config(n_experts: int = 5, top_k: int = 2, d_expert: int = 20, d_shared_expert: int = 28,
                            vision_depth: int = 2, vision_width: int = 32, vision_heads: int = 2, tokenizer=None,
                            **text_kwargs: Any) -> Qwen3_5MoeConfig:
    """A tiny Qwen3.5-MoE config: `qwen3_5_text_config`'s decoder (its keywords) with `n_experts` experts
    of size `d_expert` (top_k per token) and a shared expert of size `d_shared_expert` in every layer."""
    text = qwen3_5_text_config(tokenizer=tokenizer, **text_kwargs)
    text.pop("intermediate_size")
    text.update(num_experts=n_experts, num_experts_per_tok=top_k, moe_intermediate_size=d_expert,
                shared_expert_intermediate_size=d_shared_expert)
    vision = qwen3_5_vision_config(text["hidden_size"], vision_depth, vision_width, vision_heads)
    return Qwen3_5MoeConfig(text_config=text, vision_config=vision, tie_word_embeddings=False,
                            **special_token_ids(tokenizer))


def tiny_qwen3_5_moe_model(seed: int = 0, attn_implementation: str = "eager", dtype: torch.dtype = torch.float32,
                           experts_implementation: str = "eager",
                           **config_kwargs: Any) -> Qwen3_5MoeForConditionalGeneration:
    """A randomly initialised tiny `Qwen3_5MoeForConditionalGeneration` (eval mode, norms perturbed,
    linear attention with memory, routers sharpened).

    experts_implementation: HF's experts forward ("eager", "grouped_mm", "batched_mm").
    """
    return build_tiny_moe(Qwen3_5MoeForConditionalGeneration, tiny_qwen3_5_moe_config(**config_kwargs), seed,
                          attn_implementation, dtype, experts_implementation, finish_tiny)

"""Tiny random Qwen3-VL-MoE models (Qwen3-VL with sparse mixture-of-experts MLPs), offline.

The processor is Qwen3-VL's (`tiny_qwen3_vl_processor`: 16 px patches, Qwen's chat format).
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import Qwen3VLMoeConfig, Qwen3VLMoeForConditionalGeneration

from vlens.testing.common import finish_tiny_model
from vlens.testing.qwen import tiny_qwen3_vl_config


def sharpen_routers(model: torch.nn.Module, seed: int, logit_std: float = 2.0) -> None:
    """Random init gives routers and experts tiny weights (std 0.02): every expert is nearly equally
    likely (the top-k choice hangs on float noise) and writes almost nothing. Redraw them so a normed
    input (rms 1) gets router logits of std about `logit_std` and experts write outputs of the
    residual's size: tests route decisively, to varied experts, and expert edits show."""
    generator = torch.Generator().manual_seed(seed + 7)

    def redraw(param: torch.nn.Parameter, fan_in: int, gain: float = 1.0) -> None:
        std = gain / fan_in ** 0.5
        param.copy_(std * torch.randn(param.shape, generator=generator).to(param.dtype))

    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("mlp.gate.weight"):
                redraw(param, param.shape[1], logit_std)
            elif name.endswith("mlp.experts.gate_up_proj"):
                redraw(param, param.shape[2])
            elif name.endswith("mlp.experts.down_proj"):
                redraw(param, param.shape[2], 0.5)


def tiny_qwen3_vl_moe_config(n_experts: int = 6, top_k: int = 2, d_expert: int = 24, decoder_sparse_step: int = 1,
                             mlp_only_layers: list[int] | None = None, **kwargs: Any) -> Qwen3VLMoeConfig:
    """A tiny Qwen3-VL-MoE config: `tiny_qwen3_vl_config`'s decoder and vision tower (same keywords:
    n_layers, d_model, n_heads, n_kv_heads, d_head, d_mlp, deepstack_visual_indexes, ...) with
    `n_experts` experts of size `d_expert`, `top_k` per token, on the layers HF makes sparse
    (`decoder_sparse_step`, minus `mlp_only_layers`, which keep a dense MLP of size d_mlp)."""
    dense = tiny_qwen3_vl_config(**kwargs)
    text = dense.text_config.to_dict()
    for key in ("architectures", "model_type", "transformers_version", "dtype"):
        text.pop(key, None)
    text.update(num_experts=n_experts, num_experts_per_tok=top_k, moe_intermediate_size=d_expert,
                decoder_sparse_step=decoder_sparse_step, mlp_only_layers=list(mlp_only_layers or []))
    vision = dense.vision_config.to_dict()
    for key in ("architectures", "model_type", "transformers_version", "dtype"):
        vision.pop(key, None)
    return Qwen3VLMoeConfig(text_config=text, vision_config=vision, image_token_id=dense.image_token_id,
                            video_token_id=dense.video_token_id, vision_start_token_id=dense.vision_start_token_id,
                            vision_end_token_id=dense.vision_end_token_id, tie_word_embeddings=False)


def build_tiny_moe(model_class, config, seed: int, attn_implementation: str, dtype: torch.dtype,
                   experts_implementation: str, finish):
    """A tiny MoE model of `model_class` from `config`: HF's attention and experts implementations set,
    seeded init, `finish(model, seed)` (eval, EOS, perturbed norms), then routers and experts sharpened."""
    config._attn_implementation = attn_implementation
    # HF's reference loop over experts ("grouped_mm", HF's default, needs 16-byte aligned strides on the CPU)
    config._experts_implementation = experts_implementation
    torch.manual_seed(seed)
    model = finish(model_class(config).to(dtype), seed)
    sharpen_routers(model, seed)
    return model


def tiny_qwen3_vl_moe_model(seed: int = 0, attn_implementation: str = "eager", dtype: torch.dtype = torch.float32,
                            experts_implementation: str = "eager",
                            **config_kwargs: Any) -> Qwen3VLMoeForConditionalGeneration:
    """A randomly initialised tiny `Qwen3VLMoeForConditionalGeneration` (eval mode, norms perturbed,
    routers sharpened).

    experts_implementation: HF's experts forward ("eager", "grouped_mm", "batched_mm").
    """
    return build_tiny_moe(Qwen3VLMoeForConditionalGeneration, tiny_qwen3_vl_moe_config(**config_kwargs), seed,
                          attn_implementation, dtype, experts_implementation, finish_tiny_model)

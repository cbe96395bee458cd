"""Rotary position embeddings.

The cos/sin tables come from the HF model's own rotary module, which already covers every
variant vlens supports — 1-D RoPE (LLaVA/Llama, with any rope scaling), chunked M-RoPE
(Qwen2-VL, Qwen2.5-VL: `mrope_section` blocks of t/h/w frequencies) and interleaved M-RoPE
(Qwen3-VL) — so positions are bit-identical to HF. Like HF, cos/sin are cast to the
activation dtype.
"""

from __future__ import annotations

import torch
from jaxtyping import Float, Int
from torch import Tensor, nn


class RotaryEmbedding(nn.Module):
    """Wraps HF's rotary module: position ids -> (cos, sin), each [batch, pos, d_head]."""

    def __init__(self, hf_rotary: nn.Module, kind: str):
        super().__init__()
        self.hf_rotary = hf_rotary
        self.kind = kind

    def forward(
        self,
        x: Float[Tensor, "batch pos d_model"],
        position_ids: Int[Tensor, "... batch pos"],
    ) -> tuple[Float[Tensor, "batch pos d_head"], Float[Tensor, "batch pos d_head"]]:
        return self.hf_rotary(x, position_ids)


def rotate_half(x: Tensor) -> Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rotate_adjacent(x: Tensor) -> Tensor:
    """The rotation of adjacent pairs (x[2i], x[2i+1]) -> (-x[2i+1], x[2i]) (GPT-J style; GLM-4V's
    `rotate_half_llm`), for cos / sin tables that repeat each frequency twice in a row."""
    return torch.stack((-x[..., 1::2], x[..., 0::2]), dim=-1).flatten(-2)


def apply_rotary(
    x: Float[Tensor, "batch pos heads d_head"],
    cos: Float[Tensor, "batch pos d_head"],
    sin: Float[Tensor, "batch pos d_head"],
    adjacent_pairs: bool = False,
) -> Float[Tensor, "batch pos heads d_head"]:
    """Rotate q or k ([batch, pos, heads, d_head] layout) by the given angles.

    Partial rotary (Qwen3.5: `partial_rotary_factor`): when cos / sin cover fewer than d_head
    dimensions, only the first cos.shape[-1] are rotated and the rest pass through, as in HF.
    adjacent_pairs (`VLMConfig.rope_adjacent_pairs`, GLM-4V): dimensions 2i and 2i+1 rotate together
    instead of i and i + d / 2.
    """
    cos = cos.unsqueeze(2)
    sin = sin.unsqueeze(2)
    rotate = rotate_adjacent if adjacent_pairs else rotate_half
    rotary_dim = cos.shape[-1]
    if rotary_dim == x.shape[-1]:
        return (x * cos) + (rotate(x) * sin)
    x_rot, x_pass = x[..., :rotary_dim], x[..., rotary_dim:]
    return torch.cat([(x_rot * cos) + (rotate(x_rot) * sin), x_pass], dim=-1)


class LayerTypeRotary(RotaryEmbedding):
    """Wraps an HF rotary module with one table per layer type (Gemma 3: ``forward(x, position_ids,
    layer_type)``, a local base for "sliding_attention" and a global one for "full_attention").

    Returns (cos, sin), each [batch, pos, n_types, d_head] in the order of `layer_types`
    (`VLMConfig.rope_layer_types`); each attention layer reads its own (`Attention.rotary_tables`).
    """

    def __init__(self, hf_rotary: nn.Module, layer_types: list[str], kind: str = "1d"):
        super().__init__(hf_rotary, kind)
        self.layer_types = list(layer_types)

    def forward(
        self,
        x: Float[Tensor, "batch pos d_model"],
        position_ids: Int[Tensor, "... batch pos"],
    ) -> tuple[Float[Tensor, "batch pos n_types d_head"], Float[Tensor, "batch pos n_types d_head"]]:
        tables = [self.hf_rotary(x, position_ids, layer_type) for layer_type in self.layer_types]
        return torch.stack([cos for cos, _ in tables], dim=2), torch.stack([sin for _, sin in tables], dim=2)

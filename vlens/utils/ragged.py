"""Per-layer tensors whose head dimension differs by layer (hybrid decoders), stacked into one grid."""

from __future__ import annotations

import torch
from torch import Tensor


def pad_heads(per_layer: list[Tensor], width: int, dim: int = 0, fill: float = float("nan")) -> Tensor:
    """Stack per-layer tensors [..., heads_l, ...] (heads on their last dimension) along a new layer
    dimension `dim`, padding each layer's heads to `width` with `fill` (NaN: "no such head").

    >>> pad_heads([torch.ones(2), torch.ones(3)], 3).tolist()
    [[1.0, 1.0, nan], [1.0, 1.0, 1.0]]
    """
    padded = []
    for values in per_layer:
        missing = width - values.shape[-1]
        if missing < 0:
            raise RuntimeError(f"a layer has {values.shape[-1]} heads, more than the grid's {width}")
        if missing:
            values = torch.cat([values, values.new_full((*values.shape[:-1], missing), fill)], dim=-1)
        padded.append(values)
    return torch.stack(padded, dim=dim)

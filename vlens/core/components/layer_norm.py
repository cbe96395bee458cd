"""LayerNorm without a bias (Cohere's), with TransformerLens hooks, numerically identical to HF's.

HF's `CohereLayerNorm` / `Cohere2LayerNorm` computes in fp32: ``w * (x - mean(x)) / sqrt(var(x) + eps)``,
then casts back. `hook_scale` is sqrt(var + eps) [..., 1] and `hook_normalized` the centred x / scale
before the weight (fp32), as TransformerLens's LayerNorm hooks. `LayerNormPre` only normalizes: the
decoder's final norm is one, its weight applied by `Unembed` (in fp32, then cast, HF's order).
"""

from __future__ import annotations

import torch
from jaxtyping import Float
from torch import Tensor, nn

from vlens.core.components.rms_norm import RMSNormPre, compute_weight
from vlens.core.hooks import is_observed


class LayerNormPre(RMSNormPre):
    """(x - mean(x)) / sqrt(var(x) + eps) computed and returned in fp32, no weight (the next module applies
    it in fp32 and casts back, as HF does). A subclass of `RMSNormPre` so blocks take it where they take a
    norm; `centered` tells readers (lenses, residual decompositions) that the mean is removed first."""

    centered = True

    def forward(self, x: Float[Tensor, "... d"]) -> Float[Tensor, "... d"]:
        hidden = x.to(torch.float32)
        hidden = hidden - hidden.mean(-1, keepdim=True)
        variance = hidden.pow(2).mean(-1, keepdim=True) + self.eps
        if is_observed(self.hook_scale):
            hidden = hidden / self.hook_scale(variance.sqrt())
        else:
            hidden = hidden * torch.rsqrt(variance)  # HF's exact arithmetic
        return self.hook_normalized(hidden)


class LayerNorm(LayerNormPre):
    """w * (x - mean(x)) / sqrt(var(x) + eps), no bias, in fp32 and cast back once (HF's Cohere LayerNorm);
    `w` is the HF parameter itself."""

    def __init__(self, weight: nn.Parameter, eps: float, source: nn.Module | None = None):
        super().__init__(eps)
        self.w = weight
        self.__dict__["source"] = source  # not a submodule: its parameter is already ours

    @property
    def weight(self) -> nn.Parameter:
        return self.w

    def forward(self, x: Float[Tensor, "... d"]) -> Float[Tensor, "... d"]:
        return (compute_weight(self.w, self.source).float() * super().forward(x)).to(x.dtype)

"""The three architectures: standard (ReLU), TopK and JumpReLU."""

from __future__ import annotations

import torch
from jaxtyping import Float
from torch import Tensor, nn

from vlens.sae.base import SAE
from vlens.sae.config import JumpReLUSAEConfig, StandardSAEConfig, TopKSAEConfig, torch_dtype


class StandardSAE(SAE):
    """``acts = ReLU(pre)``."""

    cfg: StandardSAEConfig

    def activate(self, pre: Float[Tensor, "... d_sae"]) -> Float[Tensor, "... d_sae"]:
        return torch.relu(pre)


class TopKSAE(SAE):
    """``acts`` = ReLU of the k largest pre-activations of each token, zero elsewhere (ties: torch.topk's)."""

    cfg: TopKSAEConfig

    def activate(self, pre: Float[Tensor, "... d_sae"]) -> Float[Tensor, "... d_sae"]:
        if self.cfg.rescale_acts_by_decoder_norm:
            pre = pre * self.W_dec.norm(dim=-1)
        values, indices = torch.topk(pre, self.cfg.k, dim=-1, sorted=False)
        return torch.zeros_like(pre).scatter(-1, indices, torch.relu(values))

    def decode_weights(self, acts: Float[Tensor, "... d_sae"]) -> Float[Tensor, "... d_sae"]:
        if self.cfg.rescale_acts_by_decoder_norm:
            return acts / self.W_dec.norm(dim=-1)
        return acts


class _Step(torch.autograd.Function):
    """Heaviside step H(pre - threshold) with the rectangle-kernel pseudo-derivative for the threshold
    (Rajamanoharan et al. 2024): d/dθ = -(1/ε) K((pre - θ)/ε), K = 1 on (-1/2, 1/2)."""

    @staticmethod
    def forward(ctx, pre: Tensor, threshold: Tensor, bandwidth: float) -> Tensor:
        ctx.save_for_backward(pre, threshold)
        ctx.bandwidth = bandwidth
        return (pre > threshold).to(pre)

    @staticmethod
    def backward(ctx, grad: Tensor):
        pre, threshold = ctx.saved_tensors
        bandwidth = ctx.bandwidth
        kernel = (((pre - threshold) / bandwidth).abs() < 0.5).to(pre)
        grad_threshold = -(kernel * grad / bandwidth).reshape(-1, pre.shape[-1]).sum(0)
        return None, grad_threshold, None


def jump_gate(pre: Tensor, threshold: Tensor, bandwidth: float) -> Tensor:
    """H(pre - threshold), differentiable in `threshold` through the straight-through pseudo-derivative."""
    return _Step.apply(pre, threshold, bandwidth)


class JumpReLUSAE(SAE):
    """``acts = ReLU(pre) * H(pre - threshold)`` (SAELens's encode; `threshold` is a per-feature parameter).

    Training reaches the threshold through `jump_gate` (``bandwidth`` set by the trainer); at
    inference the gate is a plain comparison.
    """

    cfg: JumpReLUSAEConfig

    def __init__(self, cfg: JumpReLUSAEConfig):
        super().__init__(cfg)
        self.threshold = nn.Parameter(torch.zeros(cfg.d_sae, dtype=torch_dtype(cfg.dtype),
                                                  device=torch.device(cfg.device)))
        self.bandwidth: float | None = None  # set while training: the gate's pseudo-derivative width

    def activate(self, pre: Float[Tensor, "... d_sae"]) -> Float[Tensor, "... d_sae"]:
        if self.bandwidth is not None and self.training:
            return torch.relu(pre) * jump_gate(pre, self.threshold, self.bandwidth)
        return torch.relu(pre) * (pre > self.threshold).to(pre)

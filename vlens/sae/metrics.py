"""Reconstruction metrics of an SAE on a batch of activations."""

from __future__ import annotations

import torch
from jaxtyping import Float
from torch import Tensor


def explained_variance(x: Float[Tensor, "n d"], x_hat: Float[Tensor, "n d"]) -> float:
    """``1 - sum |x - x_hat|^2 / sum |x - mean(x)|^2`` over the batch (1: perfect, 0: the mean's error)."""
    residual = (x - x_hat).pow(2).sum()
    total = (x - x.mean(dim=0, keepdim=True)).pow(2).sum()
    return float(1 - residual / total) if float(total) > 0 else float("nan")


def l0(acts: Float[Tensor, "n d_sae"]) -> float:
    """Mean number of active (non-zero) features per token."""
    return float((acts != 0).float().sum(-1).mean())


def dead_fraction(last_fired: Tensor, tokens_seen: int, window: int) -> float:
    """Share of features that have not fired in the last `window` tokens (none are dead before that many)."""
    if tokens_seen < window:
        return 0.0
    return float((tokens_seen - last_fired >= window).float().mean())


@torch.no_grad()
def reconstruction_metrics(sae: torch.nn.Module, x: Float[Tensor, "n d"]) -> dict[str, float]:
    """Explained variance, MSE (per token, summed over d), L0 of `sae` on `x`."""
    acts = sae.encode(x)  # type: ignore[operator]
    x_hat = sae.decode(acts)  # type: ignore[operator]
    return {"explained_variance": explained_variance(x, x_hat), "mse": float((x - x_hat).pow(2).sum(-1).mean()),
            "l0": l0(acts)}

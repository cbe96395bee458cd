"""Planted MLPs for the transcoder and graph tests: ReLU MLPs a transcoder can equal exactly."""

from __future__ import annotations

import torch
from torch import nn


class PlantedMLP(nn.Module):
    """relu(x @ E + b) @ D in place of a block's MLP (a transcoder with these weights is perfect)."""

    def __init__(self, e: torch.Tensor, b: torch.Tensor, d: torch.Tensor):
        super().__init__()
        self.e, self.b, self.d = e, b, d

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x @ self.e + self.b) @ self.d


def plant(model, tc, layer: int, e: torch.Tensor, b: torch.Tensor, d: torch.Tensor) -> None:
    """Replace decoder layer `layer`'s MLP by ``relu(x @ e + b) @ d`` and give the PLT `tc` the same weights there
    (its decoder writes to its own layer only), so the transcoder is exact at that layer."""
    model.blocks[layer].mlp = PlantedMLP(e, b, d)
    with torch.no_grad():
        tc.W_enc[layer].copy_(e)
        tc.b_enc[layer].copy_(b)
        tc.W_dec[layer][:, 0].copy_(d)

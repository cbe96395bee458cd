"""Unembedding around the HF `lm_head`."""

from __future__ import annotations

import torch
from jaxtyping import Float
from torch import Tensor, nn


class Unembed(nn.Module):
    def __init__(self, lm_head: nn.Linear):
        super().__init__()
        self.lm_head = lm_head

    @property
    def W_U(self) -> Float[Tensor, "d_model d_vocab"]:
        return self.lm_head.weight.T

    @property
    def b_U(self) -> Float[Tensor, "d_vocab"]:
        if self.lm_head.bias is not None:
            return self.lm_head.bias
        return torch.zeros(self.lm_head.out_features, dtype=self.lm_head.weight.dtype,
                           device=self.lm_head.weight.device)

    def forward(self, x: Float[Tensor, "... d_model"]) -> Float[Tensor, "... d_vocab"]:
        return self.lm_head(x)

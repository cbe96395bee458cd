"""Token embedding around the HF `nn.Embedding`."""

from __future__ import annotations

from jaxtyping import Float, Int
from torch import Tensor, nn


class Embed(nn.Module):
    """Token embedding; `W_E` is the HF embedding matrix itself, [d_vocab, d_model]."""

    def __init__(self, embedding: nn.Embedding):
        super().__init__()
        self.embedding = embedding

    @property
    def W_E(self) -> Float[Tensor, "d_vocab d_model"]:
        return self.embedding.weight

    def forward(self, tokens: Int[Tensor, "batch pos"]) -> Float[Tensor, "batch pos d_model"]:
        return self.embedding(tokens)

"""The lens interface: read a layer's residual stream as next-token logits.

A lens maps the residual stream after block `layer` into the final layer's residual space
(`transform`) and reads it out through the final norm and the unembedding (`forward`):

    logits = lens(resid, layer)          # [..., d_model] -> [..., d_vocab]

Implemented by `LogitLens` (no translation: the model's own read-out applied early),
`TunedLens` (a learned affine translator per layer, `vlens.lens.translators`) and `HeadLens`
(a tuned lens that also decodes single heads). Any analysis written against `Lens` (e.g.
`vlens.lens.logit_lens.logit_lens(..., lens=...)`) works with all three.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch
from jaxtyping import Float
from torch import Tensor, nn


class Lens(ABC, nn.Module):
    """``forward(resid, layer) -> logits``; ``transform(resid, layer) -> resid in final space``."""

    @abstractmethod
    def transform(self, resid: Float[Tensor, "... d_model"], layer: int) -> Float[Tensor, "... d_model"]:
        """The residual stream after block `layer`, mapped into the final residual space."""

    @abstractmethod
    def forward(self, resid: Float[Tensor, "... d_model"], layer: int) -> Float[Tensor, "... d_vocab"]:
        """Logits read from the residual stream after block `layer`."""

    def forward_layers(self, resid: Float[Tensor, "n_layers ... d_model"]) -> Float[Tensor, "n_layers ... d_vocab"]:
        """Every layer's reading of its own residual: ``resid[l] -> forward(resid[l], l)``."""
        return torch.stack([self.forward(r, layer) for layer, r in enumerate(resid)])

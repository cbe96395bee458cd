"""The model's read-out (final norm + unembedding) as frozen fp32 tensors.

Lenses train through the read-out but must never change (or accumulate gradients in) the
model, so the read-out is copied once, detached, in fp32. ``LensReadout.from_model`` mirrors
the model's final RMSNorm (``w * x / sqrt(mean(x^2) + eps)``, ``w = model.unembed.final_norm_weight``:
``ln_final_w``, or ``1 + ln_final_w`` for an offset norm) and
its lm_head (``W_U`` here is lm_head's own, without ``w``; ``model.W_U`` has ``w`` folded in).
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING

import torch
from jaxtyping import Float
from torch import Tensor

if TYPE_CHECKING:
    from vlens.core.model import HookedVLM


UNEMBED_HASH_CHARS = 16


def unembedding_hash(model_or_W_U) -> str:
    """sha256 of the unembedding's bytes (fp32, CPU, ``[d_model, d_vocab]``), first 16 hex chars.

    A lens stores this so it is never applied to a model whose unembedding differs.
    """
    # a model's lm_head weight, without the final norm's weight folded in (model.W_U has it)
    W_U = model_or_W_U.unembed.W_U_unfolded if hasattr(model_or_W_U, "unembed") else model_or_W_U
    data = W_U.detach().to("cpu", torch.float32).contiguous().numpy().tobytes()
    return hashlib.sha256(data).hexdigest()[:UNEMBED_HASH_CHARS]


class LensReadout:
    """``logits = (w * x / scale(x)) @ W_U + b_U`` with ``scale(x) = sqrt(mean(x^2) + eps)``.

    ``norm_weight=None`` means no final norm (a plain linear read-out, used by toy tests).
    """

    def __init__(
        self,
        W_U: Float[Tensor, "d_model d_vocab"],
        b_U: Float[Tensor, "d_vocab"] | None = None,
        norm_weight: Float[Tensor, "d_model"] | None = None,
        eps: float = 1e-6,
        centered: bool = False,
    ):
        self.W_U = W_U.detach().float()
        self.centered = centered  # a LayerNorm read-out (Cohere's): the mean is removed before the scale
        self.b_U = None if b_U is None else b_U.detach().float()
        self.norm_weight = None if norm_weight is None else norm_weight.detach().float()
        self.eps = eps

    @classmethod
    def from_model(cls, model: HookedVLM) -> LensReadout:
        """The final RMSNorm (weight ``model.unembed.ln_final_w``, ``model.ln_final.eps``) and lm_head."""
        # the weight the normalized residual is multiplied by (1 + w for Gemma's offset norm)
        weight = getattr(model.unembed, "final_norm_weight", getattr(model.unembed, "ln_final_w", None))
        if weight is None or not hasattr(model.ln_final, "eps"):
            raise TypeError(
                f"model.ln_final is {type(model.ln_final).__name__} and the unembedding holds no final-norm "
                "weight; lenses expect an RMSNorm read-out (vlens.core.components: RMSNormPre + Unembed)."
            )
        b_U = model.b_U if getattr(model.unembed.lm_head, "bias", None) is not None else None
        W_U = model.unembed.W_U_unfolded
        scale = float(getattr(model.unembed, "logit_scale", 1.0))  # Cohere's logit scale, folded into W_U
        return cls(W_U if scale == 1.0 else W_U.float() * scale, b_U, weight, model.ln_final.eps,
                   centered=bool(getattr(model.ln_final, "centered", False)))

    @property
    def d_model(self) -> int:
        return self.W_U.shape[0]

    @property
    def device(self) -> torch.device:
        return self.W_U.device

    def to(self, device) -> LensReadout:
        self.W_U = self.W_U.to(device)
        self.b_U = None if self.b_U is None else self.b_U.to(device)
        self.norm_weight = None if self.norm_weight is None else self.norm_weight.to(device)
        return self

    def scale(self, x: Float[Tensor, "... d_model"]) -> Float[Tensor, "... 1"]:
        """The final norm's divisor for a full residual (1 when there is no norm)."""
        if self.norm_weight is None:
            return torch.ones_like(x[..., :1])
        x = x.to(self.W_U.dtype)
        if self.centered:
            x = x - x.mean(-1, keepdim=True)
        return (x.pow(2).mean(-1, keepdim=True) + self.eps).sqrt()

    def normalized(self, x: Float[Tensor, "... d_model"], scale: Float[Tensor, "... 1"] | None = None
                   ) -> Float[Tensor, "... d_model"]:
        """What the unembedding reads: ``w * x / scale`` in the read-out's dtype (fp32; x itself
        without a final norm)."""
        x = x.to(self.W_U.dtype)
        if self.norm_weight is None:
            return x
        centred = x - x.mean(-1, keepdim=True) if self.centered else x
        return self.norm_weight * (centred / (self.scale(x) if scale is None else scale))

    def logits(
        self,
        x: Float[Tensor, "... d_model"],
        scale: Float[Tensor, "... 1"] | None = None,
        add_bias: bool = True,
    ) -> Float[Tensor, "... d_vocab"]:
        """Logits of a residual; with ``scale`` given, divide by it instead of x's own scale
        (how a component of the residual is read: TransformerLens's ``apply_ln_to_stack``)."""
        out = self.normalized(x, scale) @ self.W_U
        if add_bias and self.b_U is not None:
            out = out + self.b_U
        return out

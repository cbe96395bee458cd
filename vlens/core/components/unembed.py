"""Unembedding around the HF `lm_head`, with the final RMSNorm's weight folded in.

HF computes ``lm_head(w * normalized)`` with ``w`` the final norm's weight. vlens splits that
at the same place TransformerLens's ``fold_ln`` does: ``model.ln_final`` only normalizes
(`RMSNormPre`) and this module applies ``w`` and then ``lm_head``, with HF's exact arithmetic
(logits are bit-identical). ``W_U`` is therefore the *effective* unembedding
``diag(w) @ lm_head.weight.T``: ``cache.apply_ln_to_stack(stack) @ W_U`` is each component's
logit contribution and `model.tokens_to_residual_directions` (used by TransformerLens's
``cache.logit_attrs``) sums to the logits. ``W_U`` is computed from the HF parameters on each
access (never stored), so it always follows the current weights and costs no memory while
unused; `directions` reads only the requested columns.
"""

from __future__ import annotations

import torch
from jaxtyping import Float, Int
from torch import Tensor, nn

from vlens.core.components.rms_norm import compute_weight


class Unembed(nn.Module):
    """``logits = lm_head(ln_final_w * x) * logit_scale`` for a normalized residual ``x``.

    Attributes:
        lm_head: the HF output projection (weight [d_vocab, d_model], maybe tied to the embedding).
        ln_final_w: the HF final norm's weight [d_model] (the parameter itself), or None.
    """

    def __init__(self, lm_head: nn.Linear, ln_final_w: nn.Parameter | None = None,
                 ln_final_source: nn.Module | None = None, ln_final_offset: float = 0.0, logit_scale: float = 1.0):
        super().__init__()
        # what HF multiplies lm_head's output by (Cohere's `logit_scale`; 1.0 elsewhere), folded into W_U
        self.logit_scale = float(logit_scale)
        self.lm_head = lm_head
        self.ln_final_w = ln_final_w
        self.__dict__["ln_final_source"] = ln_final_source  # the HF norm (for offloaded weights); not ours
        # a zero-centred final norm (Qwen3.5) multiplies by 1 + w: its offset is 1
        self.ln_final_offset = ln_final_offset

    def _norm_weight(self) -> Tensor:
        if self.ln_final_w is None:
            raise RuntimeError("this unembedding has no final norm weight")
        weight = compute_weight(self.ln_final_w, self.__dict__["ln_final_source"])
        return weight if not self.ln_final_offset else weight + self.ln_final_offset

    @property
    def final_norm_weight(self) -> Tensor | None:
        """The weight the final norm multiplies the normalized residual by (``ln_final_w`` here; a
        norm with an offset weight returns ``1 + w``), or None without a final norm. Lenses read it."""
        return None if self.ln_final_w is None else self._norm_weight()

    @property
    def device(self) -> torch.device:
        return self.lm_head.weight.device

    @property
    def W_U(self) -> Float[Tensor, "d_model d_vocab"]:
        """Effective unembedding ``diag(ln_final_w) @ lm_head.weight.T``, computed on access."""
        weight = self.lm_head.weight.T
        weight = weight if self.ln_final_w is None else self._norm_weight().to(weight.device)[:, None] * weight
        return weight if self.logit_scale == 1.0 else weight * self.logit_scale

    @property
    def W_U_unfolded(self) -> Float[Tensor, "d_model d_vocab"]:
        """``lm_head.weight.T`` itself (a view, no copy), without the final norm's weight."""
        return self.lm_head.weight.T

    @property
    def b_U(self) -> Float[Tensor, "d_vocab"]:
        if self.lm_head.bias is not None:
            return self.lm_head.bias if self.logit_scale == 1.0 else self.lm_head.bias * self.logit_scale
        return torch.zeros(self.lm_head.out_features, dtype=self.lm_head.weight.dtype,
                           device=self.lm_head.weight.device)

    def directions(self, tokens: Int[Tensor, "..."]) -> Float[Tensor, "... d_model"]:
        """Columns of the effective ``W_U`` for `tokens` (token dims first), without building ``W_U``."""
        rows = self.lm_head.weight[tokens.to(self.device)]
        rows = rows if self.ln_final_w is None else rows * self._norm_weight().to(rows.device)
        return rows if self.logit_scale == 1.0 else rows * self.logit_scale

    def apply_norm_weight(self, x: Float[Tensor, "... d_model"]) -> Float[Tensor, "... d_model"]:
        """``ln_final_w * x``: what HF's final norm returns for a normalized ``x`` (lm_head's input).

        A norm that returns fp32 (`ZeroCenteredRMSNormPre`, `LayerNormPre`) has its ``x`` multiplied by ``w`` (or
        ``1 + w``) in fp32 and then cast to lm_head's dtype, HF's ``(x * (1 + w)).to(dtype)``."""
        if self.ln_final_w is None:
            return x
        if x.dtype == torch.float32:
            weight = compute_weight(self.ln_final_w, self.__dict__["ln_final_source"]).float() + self.ln_final_offset
            return (x * weight.to(x.device)).to(self.lm_head.weight.dtype)
        return self._norm_weight().to(x.device) * x

    def forward(self, x: Float[Tensor, "... d_model"]) -> Float[Tensor, "... d_vocab"]:
        logits = self.lm_head(self.apply_norm_weight(x))
        return logits if self.logit_scale == 1.0 else logits * self.logit_scale

"""KL(final || lens) over the whole vocabulary, cheap enough for a 152k vocabulary on a CPU.

Every lens is fitted and judged by, per row (a residual at one position),

    KL(p || q) = sum_v p_v (log p_v - log q_v),  p = softmax(final logits),  q = softmax(lens logits z).

Since ``sum_v p_v = 1`` and ``log q = z - logsumexp(z)``, this is

    KL(p || q) = sum_v p_v log p_v  -  p . z  +  logsumexp(z),

and with the read-out ``z = u @ W_U + b_U`` (``u`` the normalised residual, d_model wide),
``p . z = u . (W_U p) + p . b_U``. The target terms (``sum p log p``, ``W_U p`` [d_model],
``p . b_U``) depend on the row only, so `TargetTerms` computes them once per row; a training
step then needs one pass over the vocabulary per row and layer (``logsumexp(z)``; its gradient
``softmax(z) - p`` comes out of autograd as ``softmax(z)`` plus the d_model-wide ``W_U p``),
instead of recomputing the final logits, two log-softmaxes and the elementwise product for
every layer. The value and the gradient are the KL's own: nothing about the objective changes.
`layer_kl` (held-out reports) keeps the direct formula, with the final distribution computed once
per batch and shared by every layer.
"""

from __future__ import annotations

from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor
from torch.autograd.function import once_differentiable

from vlens.lens.readout import LensReadout

TARGET_CHUNK = 256  # rows per pass when computing target terms: [256, d_vocab] fp32 at a time


class TargetTerms:
    """The final distribution's terms of the KL, per row, filled on first use.

    neg_entropy: ``sum_v p_v log p_v`` [n]; expected_unembed: ``W_U p`` [n, d_model];
    bias_term: ``p . b_U`` [n] (0 without a bias).
    """

    def __init__(self, final: Float[Tensor, "n d_model"], readout: LensReadout):
        self.final, self.readout = final, readout
        n = final.shape[0]
        like: dict[str, Any] = {"device": readout.device, "dtype": readout.W_U.dtype}
        self.neg_entropy = torch.zeros(n, **like)
        self.expected_unembed = torch.zeros(n, readout.d_model, **like)
        self.bias_term = torch.zeros(n, **like)
        self.filled = torch.zeros(n, dtype=torch.bool)

    def fill(self, rows: Tensor) -> None:
        """Compute the terms of `rows` (CPU long indices) not computed yet."""
        todo = rows[~self.filled[rows]].unique()
        for start in range(0, len(todo), TARGET_CHUNK):
            chunk = todo[start:start + TARGET_CHUNK]
            with torch.no_grad():
                log_p = torch.log_softmax(self.readout.logits(self.final[chunk].to(self.readout.device)), dim=-1)
                p = log_p.exp()
                index = chunk.to(self.readout.device)
                self.neg_entropy[index] = (p * log_p).sum(-1)
                self.expected_unembed[index] = p @ self.readout.W_U.T
                if self.readout.b_U is not None:
                    self.bias_term[index] = p @ self.readout.b_U
            self.filled[chunk] = True

    def kl(self, rows: Tensor, lens_input: Float[Tensor, "rows d_model"]) -> Float[Tensor, "rows"]:
        """KL(final || readout(lens_input)) of `rows`, differentiable in `lens_input` (the residual
        the read-out decodes, e.g. a translator's output)."""
        self.fill(rows)
        index = rows.to(self.readout.device)
        u = self.readout.normalized(lens_input)
        target_dot = (u * self.expected_unembed[index]).sum(-1) + self.bias_term[index]
        return self.neg_entropy[index] - target_dot + ReadoutLogSumExp.apply(u, self.readout.W_U, self.readout.b_U)


class ReadoutLogSumExp(torch.autograd.Function):
    """``logsumexp(u @ W_U + b_U)`` per row, differentiable in `u` only (the read-out is frozen).

    The logits are made, exponentiated and kept in one buffer (``torch.logsumexp`` allocates
    three of that size and makes two exponential passes); the backward turns the same buffer
    into ``softmax(z) * grad`` in place. At a 152k vocabulary these buffers are the cost. A second
    backward through the same graph (``retain_graph=True``) therefore raises autograd's in-place error.
    """

    @staticmethod
    def forward(ctx, u: Tensor, W_U: Tensor, b_U: Tensor | None) -> Tensor:
        z = u @ W_U
        if b_U is not None:
            z += b_U
        top = z.amax(-1, keepdim=True)
        z.sub_(top).exp_()
        total = z.sum(-1, keepdim=True)
        ctx.save_for_backward(z, total, W_U)
        return (top + total.log()).squeeze(-1)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: Tensor):
        exp_z, total, W_U = ctx.saved_tensors
        softmax_grad = exp_z.mul_(grad.unsqueeze(-1) / total)  # this call's own buffer, used once
        return softmax_grad @ W_U.T, None, None


def direct_kl(log_p: Float[Tensor, "rows d_vocab"], p: Float[Tensor, "rows d_vocab"],
              lens_logits: Float[Tensor, "rows d_vocab"]) -> Float[Tensor, "rows"]:
    """``sum_v p (log p - log q)`` per row, elementwise (no gradient needed: the held-out reports)."""
    diff = torch.log_softmax(lens_logits.float(), dim=-1)
    return diff.neg_().add_(log_p).mul_(p).sum(-1)  # = p * (log_p - log_q), one buffer


def layer_kl(translators, resid: Float[Tensor, "n n_layers d_model"], readout: LensReadout,
             final: Float[Tensor, "n d_model"] | None = None, batch_size: int = 512) -> Float[Tensor, "n_layers"]:
    """Mean KL(final || lens_l) per layer. `final` defaults to ``resid[:, -1]`` (resid_post of the last layer)."""
    final = resid[:, -1] if final is None else final
    total = torch.zeros(translators.n_layers)
    device = translators.A.device
    with torch.no_grad():
        for start in range(0, resid.shape[0], batch_size):
            h = resid[start:start + batch_size].to(device)
            log_p = torch.log_softmax(readout.logits(final[start:start + batch_size].to(device)), dim=-1)
            p = log_p.exp()  # once per batch, shared by every layer
            for layer in range(translators.n_layers):
                lens_logits = readout.logits(translators(h[:, layer], layer))
                total[layer] += direct_kl(log_p, p, lens_logits).sum().cpu()
    return total / max(resid.shape[0], 1)


__all__ = ["ReadoutLogSumExp", "TargetTerms", "direct_kl", "layer_kl"]

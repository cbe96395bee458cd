"""Patching metrics on the answer logits at the final prompt position.

Definitions (per pair i, with clean answer token c_i and corrupt answer token k_i; "prediction"
is the argmax token at the final position):

- logit difference: LD = logit[k_i] - logit[c_i] (corrupt answer minus clean answer).
- overwrite: the clean run predicts c_i and the patched run predicts k_i (the prediction flips
  from the clean answer to the corrupted answer). Overwrite rate = share of all pairs.
- flip-away: the clean run predicts c_i and the patched run predicts anything else.
- corrupt-answer rate: the patched run predicts k_i, whatever the clean run predicted (equal to
  the overwrite rate when the model gets every clean prompt right).
- normalised patch effect: (LD_patched - LD_clean) / (LD_corrupt - LD_clean), on the pair
  means of LD: 0 = no effect, 1 = the patched run is as "corrupt" as the corrupt run.

Non-finite logits (a NaN activation) are never turned into predictions: such a pair's logit
difference is NaN, its prediction -1, and every rate over it NaN (see `vlens.finite`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from jaxtyping import Float, Int
from torch import Tensor

from vlens.finite import finite_rows

METRICS: tuple[str, ...] = ("overwrite_rate", "flip_away_rate", "logit_diff", "patch_effect", "corrupt_answer_rate")


def logit_diff(logits: Float[Tensor, "... n_pairs d_vocab"], clean_tokens: Int[Tensor, "n_pairs"],
               corrupt_tokens: Int[Tensor, "n_pairs"]) -> Float[Tensor, "... n_pairs"]:
    """logit[corrupt answer] - logit[clean answer], per pair (leading condition dims kept)."""
    clean_tokens, corrupt_tokens = clean_tokens.to(logits.device), corrupt_tokens.to(logits.device)
    index = torch.stack([corrupt_tokens, clean_tokens], dim=-1).expand(*logits.shape[:-1], 2)
    picked = logits.gather(-1, index)
    return picked[..., 0] - picked[..., 1]


@dataclass
class Baseline:
    """The unpatched runs: per-pair final-position logits of the clean and corrupt inputs."""

    clean_logits: Float[Tensor, "n_pairs d_vocab"]
    corrupt_logits: Float[Tensor, "n_pairs d_vocab"]
    clean_tokens: Int[Tensor, "n_pairs"]
    corrupt_tokens: Int[Tensor, "n_pairs"]

    @property
    def clean_logit_diff(self) -> Float[Tensor, "n_pairs"]:
        """NaN for pairs whose clean logits are not finite."""
        values = logit_diff(self.clean_logits, self.clean_tokens, self.corrupt_tokens)
        return values.masked_fill(~finite_rows(self.clean_logits), torch.nan)

    @property
    def corrupt_logit_diff(self) -> Float[Tensor, "n_pairs"]:
        """NaN for pairs whose corrupt logits are not finite."""
        values = logit_diff(self.corrupt_logits, self.clean_tokens, self.corrupt_tokens)
        return values.masked_fill(~finite_rows(self.corrupt_logits), torch.nan)

    @property
    def finite(self) -> Tensor:
        """bool [n_pairs]: both unpatched runs gave finite logits."""
        return (finite_rows(self.clean_logits) & finite_rows(self.corrupt_logits)).cpu()

    @property
    def clean_correct(self) -> Tensor:
        """bool [n_pairs]: the clean run predicts the clean answer (False where its logits are not finite)."""
        return (self.clean_logits.argmax(-1).cpu() == self.clean_tokens.cpu()) & finite_rows(self.clean_logits).cpu()

    @property
    def corrupt_correct(self) -> Tensor:
        """bool [n_pairs]: the corrupt run predicts the corrupt answer (False where its logits are not finite)."""
        return ((self.corrupt_logits.argmax(-1).cpu() == self.corrupt_tokens.cpu())
                & finite_rows(self.corrupt_logits).cpu())


def reduce_patched(patched_logits: Float[Tensor, "... n_pairs d_vocab"], clean_tokens: Int[Tensor, "n_pairs"],
                   corrupt_tokens: Int[Tensor, "n_pairs"]) -> tuple[Float[Tensor, "... n_pairs"], Int[Tensor, "... n_pairs"]]:
    """What the metrics read of patched logits: (per-pair logit difference, argmax token), on CPU.

    Elementwise per pair, so reducing chunks of conditions or pairs separately gives the same values.
    """
    patched_logits = patched_logits.float().cpu()
    ok = finite_rows(patched_logits)  # non-finite logits: NaN difference, prediction -1
    per_pair = logit_diff(patched_logits, clean_tokens.cpu(), corrupt_tokens.cpu()).masked_fill(~ok, torch.nan)
    return per_pair, patched_logits.argmax(-1).masked_fill(~ok, -1)


def patch_metrics(patched_logits: Float[Tensor, "... n_pairs d_vocab"], baseline: Baseline) -> dict[str, Tensor]:
    """All metrics for patched final-position logits; each is [...] (leading condition dims).

    Also returns "per_pair_logit_diff" and "per_pair_prediction" (argmax token), both [..., n_pairs].
    """
    per_pair, prediction = reduce_patched(patched_logits, baseline.clean_tokens, baseline.corrupt_tokens)
    return metrics_from_reduced(per_pair, prediction, baseline)


def metrics_from_reduced(per_pair: Float[Tensor, "... n_pairs"], prediction: Int[Tensor, "... n_pairs"],
                         baseline: Baseline) -> dict[str, Tensor]:
    """`patch_metrics` from `reduce_patched`'s output (per-pair logit difference and argmax token)."""
    clean_tokens, corrupt_tokens = baseline.clean_tokens.cpu(), baseline.corrupt_tokens.cpu()
    # a pair is undefined where its patched (prediction -1), clean or corrupt logits are not all finite
    ok = (prediction >= 0) & baseline.finite
    clean_correct = baseline.clean_correct

    def rate(hit: Tensor) -> Tensor:
        return torch.where(ok, hit.float(), torch.nan).mean(-1)

    overwrite = clean_correct & (prediction == corrupt_tokens)
    flip_away = clean_correct & (prediction != clean_tokens)
    per_pair, prediction = per_pair.masked_fill(~ok, torch.nan), prediction.masked_fill(~ok, -1)
    clean_mean = baseline.clean_logit_diff.float().cpu().mean()
    corrupt_mean = baseline.corrupt_logit_diff.float().cpu().mean()
    denominator = corrupt_mean - clean_mean
    if abs(float(denominator)) < 1e-12:
        effect = torch.full(per_pair.shape[:-1], float("nan"))
    else:
        effect = (per_pair.mean(-1) - clean_mean) / denominator
    return {
        "overwrite_rate": rate(overwrite),
        "flip_away_rate": rate(flip_away),
        "logit_diff": per_pair.mean(-1),
        "patch_effect": effect,
        "corrupt_answer_rate": rate(prediction == corrupt_tokens),
        "per_pair_logit_diff": per_pair,
        "per_pair_prediction": prediction,
    }

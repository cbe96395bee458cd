"""Learning-rate and sparsity-coefficient schedules (pure functions of the step, so resuming needs no state)."""

from __future__ import annotations

import math

from vlens.utils.validation import check_choice

DECAYS = ("cosine", "linear", "constant")


def lr_at(step: int, total: int, peak: float, warmup: int, decay: str = "cosine", end_fraction: float = 0.0) -> float:
    """Linear warm-up to `peak` over `warmup` steps, then `decay` to ``end_fraction * peak`` at `total`."""
    check_choice(decay, "decay", DECAYS)
    if warmup > 0 and step < warmup:
        return peak * (step + 1) / warmup
    if decay == "constant" or total <= warmup:
        return peak
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    shape = 0.5 * (1 + math.cos(math.pi * progress)) if decay == "cosine" else 1 - progress
    return peak * (end_fraction + (1 - end_fraction) * shape)


def warmup_factor(step: int, warmup: int) -> float:
    """A sparsity coefficient's ramp: 0 -> 1 over `warmup` steps (1 with no warm-up)."""
    return 1.0 if warmup <= 0 else min(1.0, (step + 1) / warmup)

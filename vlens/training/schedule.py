"""The learning-rate schedule of every training loop in vlens: linear warm-up, then decay."""

from __future__ import annotations

import math

from vlens.utils.errors import UserInputError

DECAYS: tuple[str, ...] = ("linear", "cosine")


def learning_rate_at(step: int, total_steps: int, peak: float, warmup_steps: int, decay: str = "linear",
                     floor: float = 0.0) -> float:
    """Learning rate of optimizer step `step` (0-based) of `total_steps`.

    Warm-up: `peak * (step + 1) / warmup_steps` for the first `warmup_steps` steps. Then the
    rate falls from `peak` to `floor * peak` at the last step: linearly (`decay="linear"`, HF's
    `get_linear_schedule_with_warmup` when floor is 0) or along half a cosine (`"cosine"`).
    """
    if decay not in DECAYS:
        raise UserInputError(f"decay must be one of {DECAYS}, got {decay!r}")
    if step < warmup_steps:
        return peak * (step + 1) / warmup_steps
    remaining = max(1, total_steps - warmup_steps)
    if decay == "linear":
        shape = max(0.0, (total_steps - step) / remaining)
    else:
        shape = 0.5 * (1 + math.cos(math.pi * min(1.0, (step - warmup_steps) / remaining)))
    return peak * (floor + (1 - floor) * shape)

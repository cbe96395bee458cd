"""The noise floor of a normalised score's denominator: NaN and a warning instead of a ratio of noise.

Every normalised score vlens reports divides by a difference between two runs: the patch effect by
the clean-corrupt logit difference, a circuit's faithfulness by the clean-corrupt metric gap, an
SAE's loss recovered by the zero-ablation-clean loss gap. When that difference is within its own
noise, the ratio is noise too (a faithfulness of 2.26 with an interval of [-4.9, 10.1]), so one rule
decides for all of them: the denominator, a mean over examples, must exceed

    floor = max(2 standard errors of that mean over examples, 16 * resolution)

where `resolution` is one step of the numbers' precision at their magnitude (eps(dtype) * |value|).
Below the floor the score is NaN (null in JSON) and a `NoiseFloorWarning` says why.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import TypedDict

import torch
from jaxtyping import Float
from torch import Tensor

FLOOR_STANDARD_ERRORS = 2.0  # the denominator must exceed 2 standard errors of its mean over examples
FLOOR_RESOLUTION_STEPS = 16  # ... and 16 steps of the numbers' resolution (eps * magnitude)


class NoiseFloorWarning(UserWarning):
    """A normalised score is undefined: the two runs its denominator compares barely differ."""


def noise_floor(standard_error: float, resolution: float) -> float:
    """max(2 * standard_error, 16 * resolution); a NaN standard error (one example) counts as absent."""
    parts = [FLOOR_RESOLUTION_STEPS * resolution]
    if math.isfinite(standard_error):
        parts.append(FLOOR_STANDARD_ERRORS * standard_error)
    return max(parts)


class FloorRecord(TypedDict):
    """A `GapFloor` as a results file records it (`GapFloor.to_dict`; checked when a file is read)."""

    denominator: float
    standard_error: float
    resolution: float
    n: int
    floor: float
    defined: bool
    rule: str


@dataclass
class GapFloor:
    """A denominator (the mean over examples of a difference), its standard error and its floor."""

    denominator: float
    standard_error: float
    resolution: float
    n: int

    @property
    def floor(self) -> float:
        return noise_floor(self.standard_error, self.resolution)

    @property
    def defined(self) -> bool:
        return math.isfinite(self.denominator) and abs(self.denominator) > self.floor

    def describe(self, what: str) -> str:
        return (f"{what} {self.denominator:.3g} over {self.n} examples is within its noise floor {self.floor:.3g} "
                f"(standard error {self.standard_error:.3g}, resolution {self.resolution:.3g})")

    def to_dict(self) -> FloorRecord:
        return {"denominator": self.denominator, "standard_error": self.standard_error, "resolution": self.resolution,
                "n": self.n, "floor": self.floor, "defined": self.defined,
                "rule": f"NaN unless |denominator| > max({FLOOR_STANDARD_ERRORS:g} standard errors over examples, "
                        f"{FLOOR_RESOLUTION_STEPS} * resolution)"}


def gap_floor(differences: Float[Tensor, "n"], magnitude: float | None = None,
              dtype: torch.dtype = torch.float32) -> GapFloor:
    """The floor of mean(`differences`) (per-example differences between the two runs; NaN entries
    are left out). `magnitude`: the typical |value| the differences come from (default: their mean
    |value|), whose `dtype` step is the resolution."""
    d = differences.detach().double().flatten().cpu()
    d = d[d.isfinite()]
    n = int(d.numel())
    if n == 0:
        return GapFloor(math.nan, math.nan, 0.0, 0)
    mean = float(d.mean())
    standard_error = float(d.std(unbiased=True) / math.sqrt(n)) if n > 1 else math.nan
    scale = float(d.abs().mean()) if magnitude is None else abs(float(magnitude))
    return GapFloor(mean, standard_error, torch.finfo(dtype).eps * scale, n)


def pooled_gap_floor(sums: Float[Tensor, "n"], counts: Float[Tensor, "n"], magnitude: float,
                     dtype: torch.dtype = torch.float32) -> GapFloor:
    """The floor of a pooled mean sum(sums) / sum(counts): per example, `sums` the difference between the
    two runs summed over its `counts` units (tokens). Its standard error is the ratio estimator's over
    the examples, sqrt(n / (n - 1) * sum((s_i - D c_i)^2)) / sum(c_i); the resolution is `dtype`'s step at
    `magnitude` (the typical |value| per unit)."""
    s, c = sums.detach().double().flatten().cpu(), counts.detach().double().flatten().cpu()
    keep = s.isfinite() & (c > 0)
    s, c = s[keep], c[keep]
    n = int(s.numel())
    if n == 0:
        return GapFloor(math.nan, math.nan, 0.0, 0)
    total = float(c.sum())
    mean = float(s.sum()) / total
    standard_error = (math.sqrt(n / (n - 1) * float(((s - mean * c) ** 2).sum())) / total) if n > 1 else math.nan
    return GapFloor(mean, standard_error, torch.finfo(dtype).eps * abs(float(magnitude)), n)


def floored_ratio(numerator: float, floor: GapFloor, what: str, score: str, stacklevel: int = 2) -> float:
    """numerator / floor.denominator, or NaN with a `NoiseFloorWarning` naming `score` when the
    denominator (`what`) is within its noise floor."""
    if floor.defined:
        return numerator / floor.denominator
    warnings.warn(f"{score} is NaN: the {floor.describe(what)}. Use more examples or a contrast the model tells "
                  "apart.", NoiseFloorWarning, stacklevel=stacklevel + 1)
    return math.nan


__all__ = ["FLOOR_RESOLUTION_STEPS", "FLOOR_STANDARD_ERRORS", "GapFloor", "NoiseFloorWarning", "floored_ratio",
           "gap_floor", "noise_floor", "pooled_gap_floor"]

"""Uncertainty of the numbers vlens reports: intervals for shares and bootstrap intervals for means.

- `wilson_interval(k, n)`: the 95% Wilson score interval of a share k / n (accuracy, overwrite
  rate). Unlike the normal approximation it stays inside [0, 1] and is sensible at 0 / n and n / n.
- `bootstrap_interval(values)`: a percentile bootstrap interval of a mean over examples (or pairs)
  along dim 0, with a fixed seed so a report is reproducible. NaN examples are left out.
- `spread(values)`: mean, standard deviation and range over seeds (the seed spread of a study).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from jaxtyping import Float
from torch import Tensor

LEVEL = 0.95


def _z(level: float) -> float:
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    return math.sqrt(2) * torch.erfinv(torch.tensor(level, dtype=torch.float64)).item()


def wilson_interval(successes, n, level: float = LEVEL) -> tuple[Tensor, Tensor]:
    """Wilson score interval of the share successes / n (elementwise for tensors).

    Example: wilson_interval(8, 10) -> (0.490, 0.943); n = 0 gives (0, 1).
    """
    k = torch.as_tensor(successes, dtype=torch.float64)
    n = torch.as_tensor(n, dtype=torch.float64)
    if (k < 0).any() or (k > n).any():
        raise ValueError("successes must lie in [0, n]")
    z = _z(level)
    safe_n = n.clamp_min(1)
    p = k / safe_n
    centre = (p + z * z / (2 * safe_n)) / (1 + z * z / safe_n)
    half = z / (1 + z * z / safe_n) * torch.sqrt(p * (1 - p) / safe_n + z * z / (4 * safe_n * safe_n))
    # exactly 0 / 1 at k = 0 / k = n (the formula gives them up to rounding)
    low = torch.where((n > 0) & (k > 0), (centre - half).clamp(0, 1), torch.zeros_like(p))
    high = torch.where((n > 0) & (k < n), (centre + half).clamp(0, 1), torch.ones_like(p))
    return low, high


def bootstrap_interval(
    values: Float[Tensor, "n ..."] | Sequence[float], n_resamples: int = 1000, level: float = LEVEL, seed: int = 0
) -> tuple[Tensor, Tensor]:
    """Percentile bootstrap interval of the mean along dim 0 (examples or pairs).

    Returns `(low, high)`, each of shape `values.shape[1:]`. Resamples the rows with
    replacement `n_resamples` times (seeded); NaN entries are ignored in each mean.
    """
    x = torch.as_tensor(values, dtype=torch.float64)
    if x.ndim == 0 or x.shape[0] == 0:
        raise ValueError("bootstrap_interval needs at least one value along dim 0")
    if n_resamples < 1:
        raise ValueError(f"n_resamples must be >= 1, got {n_resamples}")
    _z(level)
    generator = torch.Generator().manual_seed(seed)
    index = torch.randint(0, x.shape[0], (n_resamples, x.shape[0]), generator=generator)
    means = x[index].nanmean(dim=1)  # [n_resamples, ...]
    tail = (1 - level) / 2
    quantiles = torch.tensor([tail, 1 - tail], dtype=torch.float64)
    low, high = torch.nanquantile(means, quantiles, dim=0)
    return low, high


def spread(values: Sequence[float]) -> dict[str, float]:
    """Mean, sample standard deviation (0 for one value), min and max of per-seed numbers."""
    x = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    if not x:
        return {"n": 0, "mean": math.nan, "std": math.nan, "min": math.nan, "max": math.nan}
    mean = sum(x) / len(x)
    std = math.sqrt(sum((v - mean) ** 2 for v in x) / (len(x) - 1)) if len(x) > 1 else 0.0
    return {"n": len(x), "mean": mean, "std": std, "min": min(x), "max": max(x)}


def format_interval(value: float, low: float, high: float, digits: int = 2) -> str:
    """`0.81 [0.74, 0.87]`: a number with its interval, for tables and captions."""
    if value is None or not math.isfinite(value):
        return "n/a"
    return f"{value:.{digits}f} [{low:.{digits}f}, {high:.{digits}f}]"


def format_share(share: float, n: int, digits: int = 2) -> str:
    """`0.46 [0.28, 0.65]`: a share of n examples with its 95% Wilson interval ("n/a" when NaN or n = 0)."""
    if share is None or not math.isfinite(share) or n < 1:
        return "n/a"
    low, high = wilson_interval(round(share * n), n)
    return format_interval(share, float(low), float(high), digits)


__all__ = ["LEVEL", "bootstrap_interval", "format_interval", "format_share", "spread", "wilson_interval"]

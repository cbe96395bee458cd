"""Uncertainty of the numbers vlens reports: intervals for shares and bootstrap intervals for means.

- `wilson_interval(k, n)`: the 95% Wilson score interval of a share k / n (accuracy, overwrite
  rate). Unlike the normal approximation it stays inside [0, 1] and is sensible at 0 / n and n / n.
- `bootstrap_interval(values)`: a percentile bootstrap interval of a mean over examples (or pairs)
  along dim 0, with a fixed seed so a report is reproducible. NaN examples are left out.
- `spread(values)`: mean, standard deviation and range over seeds (the seed spread of a study).
- `hypergeometric_tail(i, population, successes, draws)`: P(X >= i), exact (math.comb): the
  null of an overlap of random sets (`vlens.ablation.overlap.jaccard_p_value`) and of Fisher's
  exact test (`fisher_greater`).
- `holm(p_values)`: Holm's step-down adjustment of a family of p-values.
- `t_quantile(q, df)`: quantile of Student's t (an interval over a handful of seeds).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from jaxtyping import Float
from torch import Tensor

from vlens.utils.errors import UserInputError

LEVEL = 0.95


def _z(level: float) -> float:
    if not 0 < level < 1:
        raise UserInputError(f"level must be in (0, 1), got {level}")
    return math.sqrt(2) * torch.erfinv(torch.tensor(level, dtype=torch.float64)).item()


def wilson_interval(successes, n, level: float = LEVEL) -> tuple[Tensor, Tensor]:
    """Wilson score interval of the share successes / n (elementwise for tensors).

    Example: wilson_interval(8, 10) -> (0.490, 0.943); n = 0 gives (0, 1).
    """
    k = torch.as_tensor(successes, dtype=torch.float64)
    n = torch.as_tensor(n, dtype=torch.float64)
    if (k < 0).any() or (k > n).any():
        raise UserInputError("successes must lie in [0, n]")
    z = _z(level)
    safe_n = n.clamp_min(1)
    p = k / safe_n
    centre = (p + z * z / (2 * safe_n)) / (1 + z * z / safe_n)
    half = z / (1 + z * z / safe_n) * torch.sqrt(p * (1 - p) / safe_n + z * z / (4 * safe_n * safe_n))
    # exactly 0 / 1 at k = 0 / k = n (the formula gives them up to rounding)
    low = torch.where((n > 0) & (k > 0), (centre - half).clamp(0, 1), torch.zeros_like(p))
    high = torch.where((n > 0) & (k < n), (centre + half).clamp(0, 1), torch.ones_like(p))
    return low, high


def bootstrap_counts(n: int, n_resamples: int = 1000, seed: int = 0) -> Float[Tensor, "n_resamples n"]:
    """How often each of n rows is drawn in each bootstrap resample (rows drawn with replacement, seeded)."""
    if n < 1:
        raise UserInputError("a bootstrap needs at least one value along dim 0")
    if n_resamples < 1:
        raise UserInputError(f"n_resamples must be >= 1, got {n_resamples}")
    generator = torch.Generator().manual_seed(seed)
    index = torch.randint(0, n, (n_resamples, n), generator=generator)
    return torch.zeros(n_resamples, n, dtype=torch.float64).scatter_add_(1, index, torch.ones(index.shape,
                                                                                           dtype=torch.float64))


def resampled_means(values: Float[Tensor, "n ..."], counts: Float[Tensor, "n_resamples n"],
                    chunk: int = 4096) -> Float[Tensor, "n_resamples ..."]:
    """The mean along dim 0 of every resample (`bootstrap_counts`), NaN rows left out of each mean;
    computed as a weighted sum in chunks of columns, never as a [n_resamples, n, ...] copy."""
    x = torch.as_tensor(values, dtype=torch.float64)
    flat = x.reshape(x.shape[0], -1)
    finite = flat.isfinite().double()
    out = []
    for start in range(0, max(flat.shape[1], 1), chunk):
        part, weight = flat[:, start:start + chunk].nan_to_num(0.0), finite[:, start:start + chunk]
        out.append((counts @ (part * weight)) / (counts @ weight))  # 0 / 0 -> NaN: no finite row drawn
    return torch.cat(out, dim=1).reshape(counts.shape[0], *x.shape[1:])


def percentile_interval(draws: Float[Tensor, "n_resamples ..."], level: float = LEVEL) -> tuple[Tensor, Tensor]:
    """The central `level` percentile interval over resamples (NaN draws ignored)."""
    _z(level)
    tail = (1 - level) / 2
    low, high = torch.nanquantile(draws, torch.tensor([tail, 1 - tail], dtype=torch.float64), dim=0)
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
        raise UserInputError("bootstrap_interval needs at least one value along dim 0")
    _z(level)
    return percentile_interval(resampled_means(x, bootstrap_counts(x.shape[0], n_resamples, seed)), level)


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


def hypergeometric_tail(i: int, population: int, successes: int, draws: int) -> float:
    """P(X >= i) for X ~ Hypergeometric(population, successes, draws), computed exactly.

    X is the overlap of a fixed set of `successes` units with `draws` units drawn uniformly
    without replacement from `population`. Example: hypergeometric_tail(1, 4, 1, 1) = 0.25.
    """
    if not 0 <= successes <= population or not 0 <= draws <= population:
        raise UserInputError(f"need 0 <= successes, draws <= population, got {successes}, {draws} of {population}")
    total = math.comb(population, draws)
    top = min(successes, draws)
    mass = sum(math.comb(successes, j) * math.comb(population - successes, draws - j)
               for j in range(max(int(i), 0), top + 1))
    return min(1.0, mass / total)


def fisher_greater(hits_a: int, n_a: int, hits_b: int, n_b: int) -> float:
    """One-sided Fisher exact test that the share hits_a / n_a exceeds hits_b / n_b: the probability,
    given all hits and both group sizes, that group a holds at least `hits_a` of them by chance."""
    if not (0 <= hits_a <= n_a and 0 <= hits_b <= n_b):
        raise UserInputError("hits must lie in [0, n] in both groups")
    return hypergeometric_tail(hits_a, n_a + n_b, hits_a + hits_b, n_a)


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values (same order; NaN stays NaN and is not counted in the family).

    With m finite p-values sorted p_(1) <= ... <= p_(m): adj_(j) = max_{l <= j} min(1, (m - l + 1) p_(l)).
    A hypothesis is rejected at level a when its adjusted p-value is < a; this controls the
    chance of any false rejection in the family at a.
    """
    values = [float("nan") if p is None else float(p) for p in p_values]
    finite = sorted((p, i) for i, p in enumerate(values) if math.isfinite(p))
    m = len(finite)
    adjusted = list(values)
    running = 0.0
    for rank, (p, i) in enumerate(finite):
        running = max(running, min(1.0, (m - rank) * p))
        adjusted[i] = running
    return adjusted


def _t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with `df` degrees of freedom (Simpson's rule on the density)."""
    if t < 0:
        return 1.0 - _t_cdf(-t, df)
    log_c = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)
    # substitute t = tan(u): the density times sec^2 stays smooth and bounded on [0, atan(t)]
    end, steps = math.atan(t), 2000
    h = end / steps

    def f(u: float) -> float:
        x = math.tan(u)
        return math.exp(log_c - (df + 1) / 2 * math.log1p(x * x / df)) / math.cos(u) ** 2

    total = f(0.0) + f(end) + sum((4 if j % 2 else 2) * f(j * h) for j in range(1, steps))
    return 0.5 + total * h / 3


def t_quantile(q: float, df: float) -> float:
    """The q-quantile of Student's t with `df` > 0 degrees of freedom (bisection on the CDF, ~1e-9).

    Example: t_quantile(0.975, 2) = 4.303 (the 95% interval of a mean over 3 seeds).
    """
    if not 0 < q < 1:
        raise UserInputError(f"q must be in (0, 1), got {q}")
    if not df > 0:
        raise UserInputError(f"df must be positive, got {df}")
    if q < 0.5:
        return -t_quantile(1 - q, df)
    low, high = 0.0, 1.0
    while _t_cdf(high, df) < q:
        high *= 2
    for _ in range(100):
        middle = (low + high) / 2
        if _t_cdf(middle, df) < q:
            low = middle
        else:
            high = middle
        if high - low < 1e-10:
            break
    return (low + high) / 2


def mean_interval(values: Sequence[float], level: float = LEVEL) -> dict[str, float]:
    """Mean of a few numbers (per-seed gains) with its t interval: {"n", "mean", "std", "low", "high"}.

    One value gives no interval (low = high = NaN); NaN / None values are left out.
    """
    stats = spread(values)
    n = int(stats["n"])
    low = high = math.nan
    if n >= 2:
        half = t_quantile(1 - (1 - level) / 2, n - 1) * stats["std"] / math.sqrt(n)
        low, high = stats["mean"] - half, stats["mean"] + half
    return {"n": n, "mean": stats["mean"], "std": stats["std"], "low": low, "high": high}


def p_number(p: float | None) -> str:
    """A p-value's digits: `0.031`, `< 0.001`, `0.42`, `n/a` (to follow "p " or "p-value ")."""
    if p is None or not math.isfinite(p):
        return "n/a"
    return "< 0.001" if p < 0.001 else f"{p:.3f}" if p < 0.1 else f"{p:.2f}"


def format_p(p: float | None) -> str:
    """A p-value for text: `p = 0.031`, `p < 0.001`, `p = n/a`."""
    text = p_number(p)
    return f"p {text}" if text.startswith("<") else f"p = {text}"


__all__ = ["LEVEL", "bootstrap_counts", "bootstrap_interval", "percentile_interval", "resampled_means", "fisher_greater", "format_interval", "format_p", "format_share", "holm",
           "hypergeometric_tail", "mean_interval", "p_number", "spread", "t_quantile", "wilson_interval"]

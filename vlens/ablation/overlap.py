"""Top-k head sets and their Jaccard overlap (across tasks, or patching vs ablation)."""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Mapping

import torch
from jaxtyping import Float
from torch import Tensor

from vlens.utils.errors import UserInputError
from vlens.utils.stats import holm, hypergeometric_tail

logger = logging.getLogger(__name__)

Head = tuple[int, int]


def rank_heads(scores: Float[Tensor, "n_layers n_heads"], absolute: bool = False,
               tiebreak: Tensor | None = None) -> list[Head]:
    """All heads, most important first (highest score; |score| if `absolute`).

    Ties are broken by `tiebreak` (same shape, higher first) and then by (layer, head).
    """
    scores = torch.as_tensor(scores, dtype=torch.float64)
    if scores.ndim != 2:
        raise UserInputError(f"scores must be [n_layers, n_heads], got shape {tuple(scores.shape)}")
    values = torch.nan_to_num(scores.abs() if absolute else scores, nan=float("-inf"))  # NaN: not measured
    n_heads = scores.shape[1]
    second = torch.zeros_like(values) if tiebreak is None else torch.as_tensor(tiebreak, dtype=torch.float64)
    order = sorted(range(values.numel()),
                   key=lambda i: (-float(values.flatten()[i]), -float(second.flatten()[i]), i))
    return [(i // n_heads, i % n_heads) for i in order]


def top_k_heads(scores: Float[Tensor, "n_layers n_heads"], k: int = 20, absolute: bool = False,
                tiebreak: Tensor | None = None) -> list[Head]:
    """The k most important heads (see `rank_heads`); all heads if k exceeds their number.

    Heads whose score is NaN (not measured, or non-finite) are never in the set, so it may hold
    fewer than k heads.
    """
    if k < 1:
        raise UserInputError(f"top-k needs k >= 1, got {k}")
    measured = ~torch.as_tensor(scores, dtype=torch.float64).isnan()
    return [head for head in rank_heads(scores, absolute, tiebreak) if bool(measured[head])][:k]


def jaccard(a: Iterable[Head], b: Iterable[Head]) -> float:
    """|A ∩ B| / |A ∪ B| of two head sets (1.0 for two empty sets)."""
    set_a: set[tuple[int, ...]] = {tuple(h) for h in a}
    set_b: set[tuple[int, ...]] = {tuple(h) for h in b}
    union = set_a | set_b
    return 1.0 if not union else len(set_a & set_b) / len(union)


def chance_jaccard(k: int, n: int) -> float:
    """Expected Jaccard of two independent uniformly random k-subsets of n heads: the level a
    task pair reaches by chance (k = 20 of 32 heads gives ~0.45, so small models want small k).

    |A ∩ B| is hypergeometric: P(i) = C(k, i) C(n - k, k - i) / C(n, k); J = i / (2k - i).
    """
    if not 1 <= k <= n:
        raise UserInputError(f"chance_jaccard needs 1 <= k <= n, got k={k}, n={n}")
    total = math.comb(n, k)
    return sum(math.comb(k, i) * math.comb(n - k, k - i) / total * i / (2 * k - i) for i in range(k + 1))


def jaccard_p_value(a: Iterable[Head], b: Iterable[Head], n: int) -> float:
    """P(J >= observed) for two independent uniformly random sets of |A| and |B| of n units.

    The exact null: |A ∩ B| ~ Hypergeometric(n, |A|, |B|) and J = i / (|A| + |B| - i) grows
    with i, so the p-value is the upper tail P(I >= |A ∩ B|). Example: two top-8 sets of 32
    heads sharing 3 (J = 0.23) give p = 0.31; sharing 4 (J = 0.33), p = 0.08.
    """
    set_a: set[tuple[int, ...]] = {tuple(h) for h in a}
    set_b: set[tuple[int, ...]] = {tuple(h) for h in b}
    if max(len(set_a), len(set_b)) > n:
        raise UserInputError(f"sets of {len(set_a)} and {len(set_b)} units cannot come from {n} units")
    return hypergeometric_tail(len(set_a & set_b), n, len(set_a), len(set_b))


def jaccard_p_matrix(head_sets: Mapping[str, Iterable[Head]], n: int) -> Float[Tensor, "n_sets n_sets"]:
    """Pairwise `jaccard_p_value` of named head sets (same order as `jaccard_matrix`); NaN on the diagonal."""
    sets = [list(head_sets[name]) for name in head_sets]
    return torch.tensor([[float("nan") if i == j else jaccard_p_value(a, b, n) for j, b in enumerate(sets)]
                         for i, a in enumerate(sets)], dtype=torch.float64)


def holm_matrix(p_values: Float[Tensor, "n n"]) -> Float[Tensor, "n n"]:
    """Holm-adjusted p-values of a symmetric matrix, the family being its upper triangle (each pair once)."""
    p_values = torch.as_tensor(p_values, dtype=torch.float64)
    n = p_values.shape[0]
    pairs = [(i, j) for i in range(n) for j in range(i + 1, n)]
    adjusted = holm([float(p_values[i, j]) for i, j in pairs])
    out = torch.full_like(p_values, float("nan"))
    for (i, j), value in zip(pairs, adjusted, strict=True):
        out[i, j] = out[j, i] = value
    return out


def jaccard_matrix(head_sets: Mapping[str, Iterable[Head]]) -> tuple[Float[Tensor, "n n"], list[str]]:
    """Pairwise Jaccard similarity of named head sets -> ([n, n] matrix, names in order)."""
    names = list(head_sets)
    sets = [list(head_sets[n]) for n in names]
    matrix = torch.tensor([[jaccard(a, b) for b in sets] for a in sets], dtype=torch.float64)
    return matrix, names


PATCHING_METRICS: tuple[str, ...] = ("patch_effect", "overwrite_rate", "head_scores", "scores", "effects",
                                     "logit_diff", "z")


def unranked_heads(data, metric: str | None = None) -> int:
    """How many cells of a patching JSON's ranking grid are null (NaN): heads a ranking leaves out."""
    if isinstance(data, Mapping):
        keys = [metric] if metric else [key for key in PATCHING_METRICS if key in data]
        data = data.get(keys[0]) if keys else None
    if not isinstance(data, list):
        return 0
    return sum(v is None or v != v for row in data for v in (row if isinstance(row, list) else [row]))


def _as_grid(values) -> Tensor:
    """A JSON grid (null -> NaN) or a tensor as float64."""
    if isinstance(values, Tensor):
        return values.double()

    def number(v):
        return [number(x) for x in v] if isinstance(v, list) else float("nan") if v is None else v

    return torch.as_tensor(number(values), dtype=torch.float64)


def _say_unranked(grid: Tensor, name: str, data: Mapping) -> None:
    """Refuse a grid with no measured head; log how many heads a ranking by it leaves out."""
    missing = int(grid.isnan().sum()) if grid.ndim == 2 else 0
    if not missing:
        return
    floor = data.get("patch_effect_floor") if name == "patch_effect" else None
    why = (f" (the patch effect is undefined: {floor.get('rule', 'below the noise floor')})"
           if isinstance(floor, Mapping) and floor.get("defined") is False else
           " (null: below the patch effect's noise floor, or not finite)")
    if missing == grid.numel():
        raise UserInputError(f"patching JSON: every head's {name} is null{why}; rank the heads by another grid "
                             "(--patching-metric overwrite_rate or logit_diff)")
    logger.warning("patching JSON: %d of %d heads have no %s%s; they are left out of the ranking", missing,
                   grid.numel(), name, why)


def head_set_from_json(data, n_layers: int | None = None, n_heads: int | None = None, k: int = 20,
                       metric: str | None = None) -> list[Head]:
    """A head set from patching (or any) results: the top-k heads of a score grid by |score|
    (patch effects may have either sign), or an explicit list of heads.

    Heads whose score is null / NaN (a patch effect below its noise floor) are left out, with a
    logged warning saying how many; a grid with no score at all is refused.

    Accepted:
    - `vlens patch --mode layer-head` / `--mode atp` JSON: the grid under `metric` (default
      the first of PATCHING_METRICS present), rows labelled by "layers", columns by "heads";
    - a dict with "heads": [[layer, head], ...] or [{"layer": l, "head": h}, ...] (taken as is);
    - a bare [n_layers, n_heads] grid.
    """
    if isinstance(data, Mapping):
        listed = data.get("heads")
        if isinstance(listed, list) and listed and all(isinstance(h, (list, tuple, Mapping)) for h in listed):
            return [(int(h["layer"]), int(h["head"])) if isinstance(h, Mapping) else (int(h[0]), int(h[1]))
                    for h in listed]
        keys = [metric] if metric else [key for key in PATCHING_METRICS if key in data]
        if not keys or keys[0] not in data:
            raise UserInputError(f"patching JSON: no head scores under {metric or PATCHING_METRICS} and no explicit "
                             f"'heads' list of [layer, head] (keys: {sorted(data)})")
        grid = _as_grid(data[keys[0]])
        _say_unranked(grid, keys[0], data)
        layer_labels = data.get("layers") or list(range(grid.shape[0]))
        head_labels = listed if isinstance(listed, list) and listed else list(range(grid.shape[-1]))
        if grid.ndim != 2 or grid.shape != (len(layer_labels), len(head_labels)):
            raise UserInputError(f"patching JSON: {keys[0]!r} has shape {tuple(grid.shape)}, expected "
                             f"[{len(layer_labels)} layers, {len(head_labels)} heads]")
        ranked = top_k_heads(grid, k, absolute=True)
        return [(int(layer_labels[i]), int(head_labels[j])) for i, j in ranked]
    grid = _as_grid(data)
    _say_unranked(grid, "the grid", {})
    if grid.ndim != 2 or (n_layers is not None and tuple(grid.shape) != (n_layers, n_heads)):
        raise UserInputError(f"patching head scores must be a [n_layers, n_heads] grid"
                         f"{'' if n_layers is None else f' = [{n_layers}, {n_heads}]'}, got {tuple(grid.shape)}")
    return top_k_heads(grid, k, absolute=True)

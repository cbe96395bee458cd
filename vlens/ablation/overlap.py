"""Top-k head sets and their Jaccard overlap (across tasks, or patching vs ablation)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import torch
from jaxtyping import Float
from torch import Tensor

Head = tuple[int, int]


def rank_heads(scores: Float[Tensor, "n_layers n_heads"], absolute: bool = False,
               tiebreak: Tensor | None = None) -> list[Head]:
    """All heads, most important first (highest score; |score| if `absolute`).

    Ties are broken by `tiebreak` (same shape, higher first) and then by (layer, head).
    """
    scores = torch.as_tensor(scores, dtype=torch.float64)
    if scores.ndim != 2:
        raise ValueError(f"scores must be [n_layers, n_heads], got shape {tuple(scores.shape)}")
    values = scores.abs() if absolute else scores
    n_heads = scores.shape[1]
    second = torch.zeros_like(values) if tiebreak is None else torch.as_tensor(tiebreak, dtype=torch.float64)
    order = sorted(range(values.numel()),
                   key=lambda i: (-float(values.flatten()[i]), -float(second.flatten()[i]), i))
    return [(i // n_heads, i % n_heads) for i in order]


def top_k_heads(scores: Float[Tensor, "n_layers n_heads"], k: int = 20, absolute: bool = False,
                tiebreak: Tensor | None = None) -> list[Head]:
    """The k most important heads (see `rank_heads`); all heads if k exceeds their number."""
    if k < 1:
        raise ValueError(f"top-k needs k >= 1, got {k}")
    return rank_heads(scores, absolute, tiebreak)[:k]


def jaccard(a: Iterable[Head], b: Iterable[Head]) -> float:
    """|A ∩ B| / |A ∪ B| of two head sets (1.0 for two empty sets)."""
    a, b = {tuple(h) for h in a}, {tuple(h) for h in b}
    union = a | b
    return 1.0 if not union else len(a & b) / len(union)


def jaccard_matrix(head_sets: Mapping[str, Iterable[Head]]) -> tuple[Float[Tensor, "n n"], list[str]]:
    """Pairwise Jaccard similarity of named head sets -> ([n, n] matrix, names in order)."""
    names = list(head_sets)
    sets = [set(map(tuple, head_sets[n])) for n in names]
    matrix = torch.tensor([[jaccard(a, b) for b in sets] for a in sets], dtype=torch.float64)
    return matrix, names


def head_set_from_json(data, n_layers: int | None = None, n_heads: int | None = None,
                       k: int = 20) -> list[Head]:
    """A head set from patching (or any) results: a [n_layers, n_heads] score grid (top-k by
    |score|: patch effects may have either sign) or an explicit list of [layer, head] pairs.

    Dicts are searched for "head_scores", "scores", "effects", "overwrite_rate", "heads".
    """
    if isinstance(data, Mapping):
        for key in ("head_scores", "scores", "effects", "overwrite_rate", "heads"):
            if key in data:
                return head_set_from_json(data[key], n_layers, n_heads, k)
        raise ValueError("patching JSON: found none of head_scores / scores / effects / overwrite_rate / "
                         f"heads among keys {sorted(data)}")
    if isinstance(data, Sequence) and data and all(isinstance(x, Sequence) and len(x) == 2 and
                                                   all(isinstance(v, int) for v in x) for x in data) \
            and not (n_heads == 2 and len(data) == n_layers):
        return [(int(layer), int(head)) for layer, head in data]
    grid = torch.as_tensor(data, dtype=torch.float64)
    if grid.ndim != 2 or (n_layers is not None and tuple(grid.shape) != (n_layers, n_heads)):
        raise ValueError(f"patching head scores must be a [n_layers, n_heads] grid"
                         f"{'' if n_layers is None else f' = [{n_layers}, {n_heads}]'}, got {tuple(grid.shape)}")
    return top_k_heads(grid, k, absolute=True)

"""Where does counting accuracy break? The best small-vs-large split, with a p-value that pays for choosing it.

The paper splits at 4 (counts 1-4 vs >= 5). A model may break elsewhere; picking the split with
the largest difference and then testing it as if it had been fixed in advance overstates the
evidence. `best_split` scans every split k (counts <= k vs > k), scores each by the pooled
two-proportion z statistic, and tests the maximum against the same maximum under random
permutations of the correct / wrong labels over the images (the null: accuracy does not depend
on the count). The permutation p-value is (1 + #{max z_perm >= max z}) / (1 + n_permutations).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from vlens.utils.errors import UserInputError

N_PERMUTATIONS = 2000


@dataclass
class SplitTest:
    """The best split k (counts <= k vs > k), its accuracies, z statistic and permutation p-value."""

    split: int
    small_accuracy: float
    large_accuracy: float
    small_n: int
    large_n: int
    z: float
    p_value: float
    n_permutations: int
    z_per_split: dict[int, float]

    def to_dict(self) -> dict:
        return asdict(self)


def _split_z(hits: Float[Tensor, "... n_counts"], n: Float[Tensor, " n_counts"]) -> Float[Tensor, "... n_splits"]:
    """Pooled two-proportion z of (counts <= k) vs (counts > k) for every k but the last count."""
    small_hits, small_n = hits.cumsum(-1)[..., :-1], n.cumsum(-1)[:-1]
    total_hits, total_n = hits.sum(-1, keepdim=True), n.sum()
    large_hits, large_n = total_hits - small_hits, total_n - small_n
    pooled = total_hits / total_n
    se = torch.sqrt(pooled * (1 - pooled) * (1 / small_n + 1 / large_n))
    z = (small_hits / small_n - large_hits / large_n) / se
    return torch.nan_to_num(z, nan=0.0)  # every answer right (or wrong): no split differs


def best_split(targets: Sequence[int] | Int[Tensor, " n"], correct: Sequence[bool] | Bool[Tensor, " n"],
               n_permutations: int = N_PERMUTATIONS, seed: int = 0) -> SplitTest:
    """The split of the counts with the largest small-minus-large z, tested by permutation (max statistic)."""
    targets_t = torch.as_tensor(list(targets), dtype=torch.long)
    correct_t = torch.as_tensor(list(correct), dtype=torch.float64)
    if targets_t.numel() != correct_t.numel() or targets_t.numel() == 0:
        raise UserInputError(f"best_split needs one correct/wrong label per target, got {targets_t.numel()} targets "
                             f"and {correct_t.numel()} labels")
    counts = torch.unique(targets_t)
    if counts.numel() < 2:
        raise UserInputError(f"best_split needs at least two distinct counts, got {counts.tolist()}")
    if n_permutations < 1:
        raise UserInputError(f"n_permutations must be >= 1, got {n_permutations}")
    one_hot = (targets_t[:, None] == counts[None, :]).to(torch.float64)  # [n, n_counts]
    n, hits = one_hot.sum(0), correct_t @ one_hot  # images and right answers per count
    z = _split_z(hits, n)
    best = int(torch.argmax(z))
    generator = torch.Generator().manual_seed(seed)
    order = torch.argsort(torch.rand(n_permutations, correct_t.numel(), generator=generator), dim=1)
    permuted = correct_t[order] @ one_hot  # [n_permutations, n_counts]: hits per count under the null
    null_max = _split_z(permuted, n).max(-1).values
    exceed = int((null_max >= z[best] - 1e-12).sum())
    small_n, small_hits = n[: best + 1].sum(), hits[: best + 1].sum()
    large_n, large_hits = n[best + 1:].sum(), hits[best + 1:].sum()
    return SplitTest(split=int(counts[best]), small_accuracy=float(small_hits / small_n),
                     large_accuracy=float(large_hits / large_n), small_n=int(small_n), large_n=int(large_n),
                     z=float(z[best]), p_value=(1 + exceed) / (1 + n_permutations), n_permutations=n_permutations,
                     z_per_split={int(c): float(v) for c, v in zip(counts[:-1], z, strict=True)})


__all__ = ["N_PERMUTATIONS", "SplitTest", "best_split"]

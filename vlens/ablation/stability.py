"""Do the cross-task Jaccard findings hold on a second sample? Statements generated from the numbers.

A Jaccard matrix of top-k head sets from one sample of examples says little on its own: each
task's own top-k set changes between two independent samples (the test-retest Jaccard), and two
random top-k sets already overlap by `chance_jaccard(k, n)`. This module compares the matrix of
the first sample with the one of the retest sample (`cross_task_ablation(..., retest=...)`) and
writes each finding as "stable across resamples" only where both samples agree, else "unstable".
"""

from __future__ import annotations

from dataclasses import dataclass

from jaxtyping import Float
from torch import Tensor

from vlens.ablation.overlap import jaccard_matrix
from vlens.ablation.results import AblationReport


@dataclass
class OverlapStability:
    """The cross-task matrices of two independent samples, each task's test-retest Jaccard and chance."""

    names: list[str]
    first: Float[Tensor, "n n"]
    second: Float[Tensor, "n n"]
    retest: dict[str, float]
    chance: float

    def findings(self, anchor: str | None = None) -> list[str]:
        """Plain sentences, each saying whether it holds on both samples."""
        lines = []
        for task in self.names:
            value = self.retest.get(task)
            if value is None:
                continue
            verdict = ("reproduces above chance" if value > self.chance else
                       "is no more reproducible than random sets")
            lines.append(f"{task}: its top-k set on a second sample overlaps the first by {value:.2f} "
                         f"(chance {self.chance:.2f}): the ranking {verdict}.")
        rows = [anchor] if anchor in self.names else self.names
        for task in rows:
            lines.extend(self._row_findings(task))
        return lines

    def _row_findings(self, task: str) -> list[str]:
        i = self.names.index(task)
        others = [j for j in range(len(self.names)) if j != i]
        if not others:
            return []
        out = []
        closest = [max(others, key=lambda j: float(m[i, j])) for m in (self.first, self.second)]
        a, b = (self.names[j] for j in closest)
        if a == b:
            out.append(f"{task} shares most heads with {a} on both samples "
                       f"({float(self.first[i, closest[0]]):.2f}, {float(self.second[i, closest[1]]):.2f}): "
                       "stable across resamples.")
        else:
            out.append(f"{task} shares most heads with {a} on the first sample "
                       f"({float(self.first[i, closest[0]]):.2f}) but with {b} on the second "
                       f"({float(self.second[i, closest[1]]):.2f}): unstable.")
        for j in others:
            name = self.names[j]
            sides = [float(m[i, j]) > self.chance for m in (self.first, self.second)]
            values = f"{float(self.first[i, j]):.2f} / {float(self.second[i, j]):.2f}"
            if all(sides):
                out.append(f"{task} vs {name}: above chance on both samples ({values}): stable.")
            elif not any(sides):
                out.append(f"{task} vs {name}: at or below chance on both samples ({values}): no shared heads "
                           "beyond chance.")
            else:
                out.append(f"{task} vs {name}: above chance on one sample only ({values}): unstable.")
        return out

    def to_dict(self) -> dict:
        return {"tasks": self.names, "first": self.first.tolist(), "second": self.second.tolist(),
                "retest": dict(self.retest), "chance": self.chance}


def overlap_stability(report: AblationReport) -> OverlapStability | None:
    """Compare the report's two samples (None without a retest sweep)."""
    if not report.retest:
        return None
    first, names = report.jaccard()
    second_sets = {task: report.retest[task].top_heads(report.top_k, report.rank_by)
                   for task in names if task in report.retest}
    if list(second_sets) != names:
        return None
    second, _ = jaccard_matrix(second_sets)
    return OverlapStability(names=names, first=first.double(), second=second.double(),
                            retest=report.reliability() or {}, chance=report.chance_jaccard())


__all__ = ["OverlapStability", "overlap_stability"]

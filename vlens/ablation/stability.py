"""Do the cross-task Jaccard findings hold on a second sample? Statements generated from tests.

A Jaccard matrix of top-k head sets from one sample of examples says little on its own: each
task's own top-k set changes between two independent samples (the test-retest Jaccard), and two
random top-k sets already overlap (`chance_jaccard(k, n)` on average; 0.23 happens 31% of the
time for top-8 sets of 32 heads). Each overlap therefore gets the p-value of the exact null of
two random sets (`vlens.ablation.overlap.jaccard_p_value`), Holm-adjusted over the task pairs of
one sample (or over the tasks for the test-retest values). This module compares the first sample
with the retest sample (`cross_task_ablation(..., retest=...)`) and writes a finding as "stable"
only when the overlap is significant after Holm on both samples, else says which sample lacks it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from jaxtyping import Float
from torch import Tensor

from vlens.ablation.overlap import holm_matrix
from vlens.ablation.results import SIGNIFICANCE, AblationReport
from vlens.utils.stats import holm, p_number


@dataclass
class OverlapStability:
    """The cross-task matrices of two independent samples with their p-values (raw and Holm-adjusted
    over the pairs of each sample), each task's test-retest Jaccard with its p-value, and chance."""

    names: list[str]  # the tasks, in matrix order
    first: Float[Tensor, "n n"]
    second: Float[Tensor, "n n"]
    retest: dict[str, float]
    chance: float
    first_p: Float[Tensor, "n n"]
    second_p: Float[Tensor, "n n"]
    retest_p: dict[str, float] = field(default_factory=dict)
    significance: float = SIGNIFICANCE

    @property
    def first_holm(self) -> Tensor:
        return holm_matrix(self.first_p)

    @property
    def second_holm(self) -> Tensor:
        return holm_matrix(self.second_p)

    @property
    def retest_holm(self) -> dict[str, float]:
        tasks = [task for task in self.names if task in (self.retest_p or {})]
        return dict(zip(tasks, holm([self.retest_p[t] for t in tasks]), strict=True))

    def significant(self, i: int, j: int) -> tuple[bool, bool]:
        """Whether the pair's overlap is above chance after Holm on (the first, the second) sample."""
        return (bool(float(self.first_holm[i, j]) < self.significance),
                bool(float(self.second_holm[i, j]) < self.significance))

    def stable_pairs(self) -> list[tuple[str, str]]:
        """Task pairs whose overlap is significant after Holm on both samples."""
        n = len(self.names)
        return [(self.names[i], self.names[j]) for i in range(n) for j in range(i + 1, n) if all(self.significant(i, j))]

    def findings(self, anchor: str | None = None) -> list[str]:
        """Plain sentences, each saying what its test supports on both samples."""
        lines = []
        adjusted = self.retest_holm
        for task in self.names:
            value = self.retest.get(task)
            if value is None:
                continue
            p, p_holm = self.retest_p.get(task), adjusted.get(task)
            above = p_holm is not None and p_holm < self.significance
            verdict = ("reproduces above chance" if above else
                       "is not shown to be more reproducible than random sets")
            lines.append(f"{task}: its top-k set on a second sample overlaps the first by {value:.2f} "
                         f"(chance {self.chance:.2f}, p {p_number(p)}, Holm {p_number(p_holm)}): the ranking "
                         f"{verdict}.")
        rows = [anchor] if anchor in self.names else self.names
        for task in rows:
            lines.extend(self._row_findings(task))
        return lines

    def _values(self, i: int, j: int) -> str:
        return (f"{float(self.first[i, j]):.2f} / {float(self.second[i, j]):.2f}, Holm-adjusted p "
                f"{p_number(float(self.first_holm[i, j]))} / {p_number(float(self.second_holm[i, j]))}")

    def _row_findings(self, task: str) -> list[str]:
        i = self.names.index(task)
        others = [j for j in range(len(self.names)) if j != i]
        if not others:
            return []
        out = []
        closest = [max(others, key=lambda j: float(m[i, j])) for m in (self.first, self.second)]
        a, b = (self.names[j] for j in closest)
        if a == b:
            backed = all(self.significant(i, closest[0]))
            out.append(f"{task} shares most heads with {a} on both samples ({self._values(i, closest[0])}): "
                       + ("the overlap is above chance on both: stable." if backed else
                          "the same task on both, but that overlap is not above chance on both samples, so which "
                          "task shares most is not shown."))
        else:
            out.append(f"{task} shares most heads with {a} on the first sample "
                       f"({float(self.first[i, closest[0]]):.2f}) but with {b} on the second "
                       f"({float(self.second[i, closest[1]]):.2f}): unstable.")
        for j in others:
            name = self.names[j]
            sides = self.significant(i, j)
            if all(sides):
                out.append(f"{task} vs {name}: above chance on both samples ({self._values(i, j)}): stable.")
            elif not any(sides):
                out.append(f"{task} vs {name}: not above chance on either sample ({self._values(i, j)}): no shared "
                           "heads beyond chance shown.")
            else:
                which = "first" if sides[0] else "second"
                out.append(f"{task} vs {name}: above chance on the {which} sample only ({self._values(i, j)}): "
                           "unstable.")
        return out

    def to_dict(self) -> dict:
        def grid(m: Tensor) -> list:
            return [[None if v != v else round(float(v), 6) for v in row] for row in m.tolist()]

        return {"tasks": self.names, "first": self.first.tolist(), "second": self.second.tolist(),
                "first_p_value": grid(self.first_p), "second_p_value": grid(self.second_p),
                "first_p_value_holm": grid(self.first_holm), "second_p_value_holm": grid(self.second_holm),
                "retest": dict(self.retest), "retest_p_value": dict(self.retest_p),
                "retest_p_value_holm": self.retest_holm, "chance": self.chance,
                "significance": self.significance,
                "stable_pairs": [list(pair) for pair in self.stable_pairs()]}


def overlap_stability(report: AblationReport) -> OverlapStability | None:
    """Compare the report's two samples (None without a retest sweep of every task)."""
    retested = report.retest_jaccard()
    if retested is None:
        return None
    first, names = report.jaccard()
    first_p, _ = report.jaccard_p_values()
    second, second_p = retested
    return OverlapStability(names=names, first=first.double(), second=second.double(),
                            retest=report.reliability() or {}, chance=report.chance_jaccard(),
                            first_p=first_p.double(), second_p=second_p.double(),
                            retest_p=report.reliability_p_values() or {})


__all__ = ["OverlapStability", "overlap_stability"]

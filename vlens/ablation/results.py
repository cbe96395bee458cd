"""Results of head ablation: per-task head importance and the cross-task overlap report."""

from __future__ import annotations

import html
import json
import math
from dataclasses import dataclass, field
from typing import ClassVar

import torch
from jaxtyping import Float
from torch import Tensor

from vlens.ablation.overlap import (
    Head,
    chance_jaccard,
    holm_matrix,
    jaccard,
    jaccard_matrix,
    jaccard_p_value,
    rank_heads,
    top_k_heads,
)
from vlens.utils.errors import UserInputError
from vlens.utils.results import Result
from vlens.utils.stats import format_p, holm, p_number
from vlens.utils.validation import check_top_k
from vlens.viz.figures import jaccard_matrix_figure, layer_head_heatmap
from vlens.viz.report import Report

RANK_BY: tuple[str, ...] = ("logprob", "accuracy")
SIGNIFICANCE = 0.05  # a Jaccard is "above chance" when its Holm-adjusted p-value is below this
P_VALUE_TEST = ("exact: P(J >= observed) for two independent uniformly random head sets of the same sizes "
                "(|A ∩ B| hypergeometric); Holm-adjusted over the task pairs of one sample")


def _grid(values) -> list[list[float | None]]:
    """Rows of rounded floats; NaN (heads not swept) -> None, so the JSON stays valid."""
    return [[_number(v) for v in row.tolist()] for row in torch.as_tensor(values)]


def _number(value) -> float | None:
    value = float(value)
    return round(value, 6) if math.isfinite(value) else None  # JSON has no NaN / inf


def _exact(value) -> float | None:
    value = float(value)
    return value if math.isfinite(value) else None


def _exact_grid(values) -> list[list[float | None]]:
    """Rows of floats in full (NaN -> None)."""
    return [[_exact(v) for v in row.tolist()] for row in torch.as_tensor(values)]


def _p_grid(values) -> list[list[float | None]]:
    """Rows of p-values to 6 significant digits (tiny p-values keep their size); NaN -> None."""
    return [[float(f"{v:.6g}") if math.isfinite(v) else None for v in row.tolist()] for row in torch.as_tensor(values)]


def _float(value) -> float:
    return float("nan") if value is None else float(value)


def _tensor(grid: list[list[float | None]]) -> Tensor:
    return torch.tensor([[float("nan") if v is None else v for v in row] for row in grid], dtype=torch.float64)


@dataclass
class HeadAblation(Result):
    """Effect of ablating each head alone on one task.

    Attributes:
        task: task name; method: "mean" | "zero" | "resample"; alignment: how means were
            aligned ("all" | "position" | "region"); n_examples: evaluation examples.
        clean_logprob, clean_accuracy: mean answer log-probability / accuracy without ablation.
        ablated_logprob, ablated_accuracy: [n_layers, n_heads] the same with that head ablated.
        answers / answer_tokens: the evaluation answers and each one's token ids.
    The answer log-probability is the whole answer's teacher-forced log-probability (vlens.core.answers:
    the sum over its tokens of log-softmax at the position that predicts each); accuracy is 1 when
    every answer token is the argmax there. A one-token answer: log-softmax at the final prompt
    position, argmax == the answer.
    """

    task: str
    method: str
    alignment: str
    n_examples: int
    clean_logprob: float
    clean_accuracy: float
    ablated_logprob: Float[Tensor, "n_layers n_heads"]
    ablated_accuracy: Float[Tensor, "n_layers n_heads"]
    answers: list[str] | None = None
    answer_tokens: list[list[int]] | None = None
    heads_per_layer: list[int] | None = None  # where layers differ (hybrid decoders); None: all n_heads
    # what was ablated: "head" (hook_z), or "expert" (a MoE layer's expert, `vlens.ablation.experts`:
    # the grid is [n_layers, n_experts] and heads_per_layer is then the experts per layer, 0 for dense MLPs)
    unit: str = "head"

    kind: ClassVar[str] = "head_ablation"
    saved_dims: ClassVar[dict[str, str]] = {"heads_per_layer": "n_layers", "answers": "n_examples",
                                            "answer_tokens": "n_examples"}  # checked when a file is read

    def unit_label(self, layer: int, index: int) -> str:
        """"L3H5" for a head, "L3E5" for an expert."""
        return f"L{layer}{self.unit[:1].upper()}{index}"

    @property
    def n_heads_total(self) -> int:
        """Heads in the model (the grid's cells, less those beyond a layer's own heads)."""
        return sum(self.heads_per_layer) if self.heads_per_layer else self.ablated_logprob.numel()

    @property
    def logprob_drop(self) -> Float[Tensor, "n_layers n_heads"]:
        """clean - ablated answer log-probability (positive: the head helps the task)."""
        return self.clean_logprob - self.ablated_logprob

    @property
    def accuracy_drop(self) -> Float[Tensor, "n_layers n_heads"]:
        return self.clean_accuracy - self.ablated_accuracy

    def scores(self, rank_by: str = "logprob") -> Float[Tensor, "n_layers n_heads"]:
        if rank_by not in RANK_BY:
            raise UserInputError(f"rank_by must be one of {RANK_BY}, got {rank_by!r}")
        return self.logprob_drop if rank_by == "logprob" else self.accuracy_drop

    def ranking(self, rank_by: str = "logprob") -> list[Head]:
        """All heads by damage, largest first (ties: the other metric, then layer/head order)."""
        other = "accuracy" if rank_by == "logprob" else "logprob"
        return rank_heads(self.scores(rank_by), tiebreak=self.scores(other))

    def top_heads(self, k: int = 20, rank_by: str = "logprob") -> list[Head]:
        other = "accuracy" if rank_by == "logprob" else "logprob"
        return top_k_heads(self.scores(rank_by), k, tiebreak=self.scores(other))

    @property
    def finite(self) -> bool:
        """False when the unablated run itself was not finite (NaN activations): nothing measured."""
        return self.clean_logprob == self.clean_logprob and self.clean_accuracy == self.clean_accuracy

    @property
    def max_drop(self) -> float:
        """The largest answer log-prob drop of any single head: near 0, the ranking is noise
        (e.g. a task the model has not learned, or one no single head carries)."""
        return float(torch.nan_to_num(self.logprob_drop, nan=float("-inf")).max())

    def to_dict(self, top_k: int | None = None, rank_by: str = "logprob") -> dict:
        ranked = self.ranking(rank_by)
        lp, acc = self.logprob_drop, self.accuracy_drop
        return {
            "task": self.task, "method": self.method, "alignment": self.alignment, "n_examples": self.n_examples,
            # the measured values in full (a loaded result recomputes the rounded drops and the ranking exactly)
            "clean_logprob": _exact(self.clean_logprob), "clean_accuracy": _exact(self.clean_accuracy),
            "max_logprob_drop": _number(self.max_drop),
            "ranked_heads": [
                {"rank": i + 1, "layer": layer, self.unit: head, "logprob_drop": _number(lp[layer, head]),
                 "accuracy_drop": _number(acc[layer, head])}
                for i, (layer, head) in enumerate(ranked)
            ],
            "top_heads": [list(h) for h in ranked[: top_k or len(ranked)]],
            "ablated_logprob": _exact_grid(self.ablated_logprob),
            "ablated_accuracy": _exact_grid(self.ablated_accuracy),
            "answer_rule": "vlens.core.answers: whole answer teacher-forced (sum of its tokens' log-probabilities)",
            "answers": self.answers, "answer_tokens": self.answer_tokens,
            **({"heads_per_layer": self.heads_per_layer} if self.heads_per_layer else {}),
            **({"unit": self.unit} if self.unit != "head" else {}),
        }

    @classmethod
    def from_dict(cls, data: dict) -> HeadAblation:
        return cls(task=data["task"], method=data["method"], alignment=data["alignment"],
                   n_examples=data["n_examples"], clean_logprob=_float(data["clean_logprob"]),
                   clean_accuracy=_float(data["clean_accuracy"]),
                   ablated_logprob=_tensor(data["ablated_logprob"]),
                   ablated_accuracy=_tensor(data["ablated_accuracy"]), answers=data.get("answers"),
                   answer_tokens=data.get("answer_tokens"), heads_per_layer=data.get("heads_per_layer"),
                   unit=data.get("unit", "head"))

    def plot(self, rank_by: str = "logprob"):
        """Layer x head heatmap of the damage (plotly)."""
        label = "answer log-prob drop" if rank_by == "logprob" else "accuracy drop"
        return layer_head_heatmap(self.scores(rank_by).float(), title=f"{self.task}: {self.method} ablation",
                                  value_label=label, unit=self.unit)


@dataclass
class AblationReport(Result):
    """Per-task head rankings, their top-k sets and the Jaccard matrix across tasks.

    patching: optional {"source", "top_k", "heads", "jaccard": {task: J(patching set, task set)}}.
    retest: optional second sweep per task on independent evaluation examples (same
        reference); `reliability()` is the Jaccard of the two top-k sets of each task, the
        ceiling a cross-task Jaccard can be read against.
    settings: how the report was made (model, method, alignment, sizes, seed, ...).
    """

    results: dict[str, HeadAblation]
    top_k: int = 20
    rank_by: str = "logprob"
    settings: dict = field(default_factory=dict)
    patching: dict | None = None
    retest: dict[str, HeadAblation] | None = None

    kind: ClassVar[str] = "ablation_report"

    def __post_init__(self):
        if not self.results:
            raise UserInputError("an AblationReport needs at least one task's results")
        if self.rank_by not in RANK_BY:
            raise UserInputError(f"rank_by must be one of {RANK_BY}; got {self.rank_by!r}")
        check_top_k(self.top_k, "top_k", self.n_heads_total)

    @property
    def tasks(self) -> list[str]:
        return list(self.results)

    def head_sets(self) -> dict[str, list[Head]]:
        return {task: r.top_heads(self.top_k, self.rank_by) for task, r in self.results.items()}

    def jaccard(self) -> tuple[Float[Tensor, "n_tasks n_tasks"], list[str]]:
        """Jaccard similarity of the tasks' top-k head sets -> (matrix, task names); NaN for a
        task whose unablated run was not finite."""
        matrix, names = jaccard_matrix(self.head_sets())
        for i, name in enumerate(names):
            if not self.results[name].finite:
                matrix[i, :] = matrix[:, i] = float("nan")
        return matrix, names

    @property
    def n_heads_total(self) -> int:
        return next(iter(self.results.values())).n_heads_total

    @property
    def unit(self) -> str:
        """What the report ranks: "head" or "expert" (`HeadAblation.unit`)."""
        return next(iter(self.results.values())).unit

    def _measured(self, *sweeps: HeadAblation) -> int:
        """Heads every given sweep measured (finite score): the units a top-k set is drawn from."""
        finite = torch.ones(sweeps[0].ablated_logprob.shape, dtype=torch.bool)
        for sweep in sweeps:
            finite &= torch.isfinite(sweep.scores(self.rank_by))
        return int(finite.sum())

    def _p_values(self, sweeps: dict[str, HeadAblation]) -> Float[Tensor, "n n"]:
        """jaccard_p_value of every pair of the sweeps' top-k sets (NaN: diagonal, a non-finite task)."""
        names = list(sweeps)
        sets = {task: sweeps[task].top_heads(self.top_k, self.rank_by) for task in names}
        out = torch.full((len(names), len(names)), float("nan"), dtype=torch.float64)
        for i, a in enumerate(names):
            for j, b in enumerate(names):
                if i < j and sweeps[a].finite and sweeps[b].finite:
                    out[i, j] = out[j, i] = jaccard_p_value(sets[a], sets[b], self._measured(sweeps[a], sweeps[b]))
        return out

    def jaccard_p_values(self) -> tuple[Float[Tensor, "n_tasks n_tasks"], list[str]]:
        """Per task pair, the p-value of its Jaccard under the exact null of two random top-k sets
        (`vlens.ablation.overlap.jaccard_p_value`; the universe is the heads both sweeps measured).
        Diagonal NaN. `holm_matrix(p)` adjusts them for the family of pairs."""
        return self._p_values(self.results), self.tasks

    def retest_jaccard(self) -> tuple[Float[Tensor, "n_tasks n_tasks"], Float[Tensor, "n_tasks n_tasks"]] | None:
        """The cross-task Jaccard matrix and its p-values on the retest sample (None unless every task
        was retested)."""
        if not self.retest or any(task not in self.retest for task in self.tasks):
            return None
        sweeps = {task: self.retest[task] for task in self.tasks}
        matrix, _ = jaccard_matrix({task: r.top_heads(self.top_k, self.rank_by) for task, r in sweeps.items()})
        for i, task in enumerate(self.tasks):
            if not sweeps[task].finite or not self.results[task].finite:
                matrix[i, :] = matrix[:, i] = float("nan")
        return matrix, self._p_values(sweeps)

    def reliability_p_values(self) -> dict[str, float] | None:
        """Per task, the p-value of its test-retest Jaccard under the null of two random top-k sets."""
        if not self.retest:
            return None
        return {task: jaccard_p_value(self.results[task].top_heads(self.top_k, self.rank_by),
                                      again.top_heads(self.top_k, self.rank_by), self._measured(self.results[task], again))
                for task, again in self.retest.items() if task in self.results}

    def chance_jaccard(self) -> float:
        """Jaccard two random top-k sets would have: the baseline to read the matrix against."""
        return chance_jaccard(min(self.top_k, self.n_heads_total), self.n_heads_total)

    def reliability(self) -> dict[str, float] | None:
        """Per task, Jaccard of the top-k sets from the two evaluation sets (None without a retest)."""
        if not self.retest:
            return None
        return {task: jaccard(self.results[task].top_heads(self.top_k, self.rank_by),
                              again.top_heads(self.top_k, self.rank_by))
                for task, again in self.retest.items() if task in self.results}

    def to_dict(self) -> dict:
        matrix, names = self.jaccard()
        p_values, _ = self.jaccard_p_values()
        retest = self.retest_jaccard()
        reliability_p = self.reliability_p_values()
        return {
            "top_k": self.top_k, "n_heads_total": self.n_heads_total, "rank_by": self.rank_by,
            "settings": self.settings, "tasks": names,
            "jaccard": {"tasks": names, "matrix": _grid(matrix), "chance": round(self.chance_jaccard(), 6),
                        "p_value_test": P_VALUE_TEST, "significance": SIGNIFICANCE},
            "jaccard_p_value": _p_grid(p_values),
            "jaccard_p_value_holm": _p_grid(holm_matrix(p_values)),
            "retest_jaccard": None if retest is None else {
                "matrix": _grid(retest[0]), "p_value": _p_grid(retest[1]),
                "p_value_holm": _p_grid(holm_matrix(retest[1]))},
            "results": {task: r.to_dict(self.top_k, self.rank_by) for task, r in self.results.items()},
            "patching": self.patching,
            "reliability": self.reliability(),
            "reliability_p_value": reliability_p,
            "reliability_p_value_holm": None if reliability_p is None else dict(
                zip(reliability_p, holm(list(reliability_p.values())), strict=True)),
            "retest_results": None if not self.retest else {
                task: r.to_dict(self.top_k, self.rank_by) for task, r in self.retest.items()},
        }

    @classmethod
    def from_dict(cls, data: dict) -> AblationReport:
        results = {task: HeadAblation.from_dict(r) for task, r in data["results"].items()}
        retest = {task: HeadAblation.from_dict(r) for task, r in (data.get("retest_results") or {}).items()}
        return cls(results, data["top_k"], data["rank_by"], data.get("settings", {}), data.get("patching"),
                   retest or None)

    def plot(self, title: str | None = None):
        """Plotly heatmap of the Jaccard matrix (values and p-values in the cells, Holm-significant ones
        in bold) with the chance level and, when the report has a retest sweep, each task's
        test-retest Jaccard (diagonal and bars)."""
        matrix, names = self.jaccard()
        p_values, _ = self.jaccard_p_values()
        reliability = self.reliability()
        retest = [reliability.get(task, float("nan")) for task in names] if reliability else None
        reliability_p = self.reliability_p_values()
        retest_p = [reliability_p.get(task, float("nan")) for task in names] if reliability_p else None
        return jaccard_matrix_figure(matrix.float(), names,
                                     title or f"Jaccard overlap of top-{self.top_k} {self.unit}s ({self.rank_by} drop)",
                                     retest=retest, chance=self.chance_jaccard(), p_values=p_values,
                                     p_values_holm=holm_matrix(p_values), retest_p_values=retest_p,
                                     significance=SIGNIFICANCE)

    def pair_numbers(self) -> dict[str, str]:
        """`{"J(a, b)": "0.33 (p = 0.08, Holm 0.31)"}` for every task pair, then the chance level."""
        matrix, names = self.jaccard()
        p_values, _ = self.jaccard_p_values()
        adjusted = holm_matrix(p_values)
        pairs = {f"J({a}, {b})": f"{float(matrix[i, j]):.2f} ({format_p(float(p_values[i, j]))}, Holm "
                                 f"{p_number(float(adjusted[i, j]))})"
                 for i, a in enumerate(names) for j, b in enumerate(names) if i < j}
        pairs["chance level (random top-k sets)"] = f"{self.chance_jaccard():.2f}"
        return pairs

    def html_report(self, title: str = "Head ablation across tasks", findings: list[str] | None = None):
        """A `vlens.viz.Report`: the Jaccard heatmap, then per task the damage heatmap and top heads.

        findings: sentences saying which cross-task findings hold on both samples
            (`vlens.ablation.stability.overlap_stability(report).findings()`), listed under Reliability.
        """
        names = self.tasks
        unit = self.unit
        what = "attention head" if unit == "head" else "expert of every mixture-of-experts layer"
        report = Report(title, intro=f"{self.settings.get('method', '')} ablation of every {what} alone; "
                                     f"top-{self.top_k} {unit}s per task by {self.rank_by} drop. "
                                     f"Settings: {json.dumps(self.settings)}")
        pairs = self.pair_numbers()
        if len(names) >= 2 or self.retest:
            report.add_section(f"Jaccard overlap of top-k {unit} sets",
                               f"How many of their most important {unit}s two tasks share (1: the same set), with "
                               "the p-value of that overlap under two random top-k sets (exact hypergeometric "
                               f"null; bold: below {SIGNIFICANCE} after Holm's correction over the task pairs); "
                               "dashed: the mean Jaccard of two random top-k sets; * / bars: a task's own set on a "
                               "second sample.",
                               figure=self.plot(), numbers=pairs)
        else:
            report.add_section(f"Jaccard overlap of top-k {unit} sets",
                               f"Only one task ({names[0]}): there is no second {unit} set to compare with. Give "
                               "two or more tasks for the cross-task matrix, or a retest seed for this task's "
                               "test-retest Jaccard.", numbers=pairs)
        if self.retest:
            findings_html = ('<ul class="findings">' + "".join(f"<li>{html.escape(line)}</li>" for line in findings)
                             + "</ul>") if findings else None
            reliability_p = self.reliability_p_values() or {}
            report.add_section("Reliability", "Jaccard of each task's top-k set on two independent evaluation "
                               "sets, with its p-value under two random top-k sets: how far a cross-task Jaccard "
                               "can be trusted. A cross-task overlap is called stable only when it is significant "
                               "after Holm's correction on both samples (listed below).", html=findings_html,
                               numbers={task: f"{value:.2f} ({format_p(reliability_p.get(task))})"
                                        for task, value in (self.reliability() or {}).items()})
        if self.patching:
            unranked = {t: n for t, n in (self.patching.get("unranked_heads") or {}).items() if n}
            note = ("" if not unranked else " Heads whose patching score is null (below the patch effect's noise "
                    "floor, or not finite) are left out of the patching ranking: " +
                    ", ".join(f"{t}: {n}" for t, n in unranked.items()) + ".")
            report.add_section("Patching vs ablation", "Jaccard of the VAP head set and each task's ablation set."
                               + note, numbers=self.patching["jaccard"])
        for task, result in self.results.items():
            lp, acc = result.logprob_drop, result.accuracy_drop
            table = [{"rank": i + 1, unit: result.unit_label(layer, head), "logprob drop": float(lp[layer, head]),
                      "accuracy drop": float(acc[layer, head])}
                     for i, (layer, head) in enumerate(result.top_heads(self.top_k, self.rank_by))]
            note = "" if table else f" No {unit} could be measured: the runs gave NaN/inf (non-finite) values."
            report.add_section(f"{task}: damage per {unit}", f"Drop in the answer's {self.rank_by} when one {unit} "
                               f"is ablated (positive: the {unit} helps the task).{note}",
                               figure=result.plot(self.rank_by), table=table or None,
                               numbers={"clean accuracy": result.clean_accuracy, "clean log-prob": result.clean_logprob})
        return report

    def to_markdown(self) -> str:
        """The Jaccard matrix and each task's top heads as Markdown tables (for a model card)."""
        matrix, names = self.jaccard()
        method = self.settings.get("method", "mean")
        p_values, _ = self.jaccard_p_values()
        lines = [f"Jaccard overlap of each task's top-{self.top_k} {self.unit}s (of {self.n_heads_total}) by {method} "
                 f"ablation, ranked by {self.rank_by} drop; random sets would give "
                 f"{self.chance_jaccard():.2f} on average. In brackets: the p-value of the overlap under two "
                 "random top-k sets (exact hypergeometric null, not corrected for the number of pairs).", "",
                 "| task | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
        lines += [f"| {name} | " + " | ".join(
            f"{float(v):.2f}" + ("" if i == j else f" (p {p_number(float(p_values[i, j]))})")
            for j, v in enumerate(row)) + " |" for i, (name, row) in enumerate(zip(names, matrix, strict=True))]
        lines += ["", f"| task | clean accuracy | largest log-prob drop | most important {self.unit}s |",
                  "|---|---|---|---|"]
        for task, r in self.results.items():
            top = ", ".join(r.unit_label(layer, head) for layer, head in r.top_heads(min(5, self.top_k), self.rank_by))
            lines.append(f"| {task} | {r.clean_accuracy:.3f} | {r.max_drop:.3f} | {top} |")
        return "\n".join(lines) + "\n"

    def summary(self) -> str:
        """Plain-text table: per task clean accuracy and top heads, then the Jaccard matrix."""
        lines = [f"top-k = {self.top_k} of {self.n_heads_total} {self.unit}s, ranked by {self.rank_by} drop; "
                 f"two random top-k sets have Jaccard {self.chance_jaccard():.2f} on average"]
        for task, r in self.results.items():
            top = ", ".join(r.unit_label(layer, head) for layer, head in r.top_heads(min(5, self.top_k), self.rank_by))
            lines.append(f"  {task:<18} n={r.n_examples:<4} clean acc {r.clean_accuracy:.3f} "
                         f"logp {r.clean_logprob:.3f} max drop {r.max_drop:.3f} | top: {top}")
        matrix, names = self.jaccard()
        p_values, _ = self.jaccard_p_values()
        lines.append("Jaccard".ljust(18) + "".join(f"{n[:17]:>18}" for n in names))
        for name, row in zip(names, matrix, strict=True):
            lines.append(f"{name[:17]:<18}" + "".join(f"{float(v):>18.2f}" for v in row))
        lines.append("p-value".ljust(18) + "".join(f"{n[:17]:>18}" for n in names)
                     + "   (two random top-k sets; uncorrected)")
        for name, row in zip(names, p_values, strict=True):
            lines.append(f"{name[:17]:<18}" + "".join(f"{'-' if v != v else f'{float(v):.3g}':>18}" for v in row))
        reliability = self.reliability()
        if reliability is not None:
            reliability_p = self.reliability_p_values() or {}
            lines.append(f"reliability (top-{self.top_k} Jaccard, two evaluation sets): " +
                         ", ".join(f"{t} {v:.2f} ({format_p(reliability_p.get(t))})" for t, v in reliability.items()))
        if self.patching:
            lines.append(f"patching vs ablation (top-{self.patching['top_k']}): " +
                         ", ".join(f"{t} {v:.2f}" for t, v in self.patching["jaccard"].items()))
        return "\n".join(lines)

"""Scores for parsed answers: counting accuracy, MAE, per-count breakdown, confusion matrix,
and multiple-choice accuracy.

An unparsed prediction (``None``) is always scored wrong for accuracy and always reported
(``n_unparsed``). For MAE it has no value: by default MAE is over the parsed predictions
only (``mae_n`` says how many); pass ``unparsed_value`` (e.g. 0) to score it as that count.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

UNPARSED_LABEL = "unparsed"


@dataclass
class CountBreakdown:
    """Scores of the examples whose target is one count."""

    n: int
    accuracy: float
    mae: float | None
    n_unparsed: int


@dataclass
class CountingMetrics:
    """Counting scores over a set: accuracy in [0, 1], MAE in objects."""

    n: int
    accuracy: float
    mae: float | None
    mae_n: int
    n_unparsed: int
    per_count: dict[int, CountBreakdown] = field(default_factory=dict)
    # mean teacher-forced log-probability of the target answer (vlens.answers), when scored
    mean_target_logprob: float | None = None

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class ChoiceMetrics:
    """Multiple-choice scores: accuracy in [0, 1], overall and per category when given."""

    n: int
    accuracy: float
    n_unparsed: int
    per_category: dict[str, dict[str, float | int]] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


def _check_lengths(predictions: Sequence, targets: Sequence) -> None:
    if len(predictions) != len(targets):
        raise ValueError(f"got {len(predictions)} predictions for {len(targets)} targets; they must pair up")


def _count_scores(predictions: Sequence[int | None], targets: Sequence[int], unparsed_value: int | None):
    """(n, accuracy, mae, mae_n, n_unparsed) for aligned predictions and targets."""
    n = len(targets)
    correct = sum(p is not None and p == t for p, t in zip(predictions, targets, strict=True))
    n_unparsed = sum(p is None for p in predictions)
    errors = [
        abs((unparsed_value if p is None else p) - t)
        for p, t in zip(predictions, targets, strict=True)
        if p is not None or unparsed_value is not None
    ]
    mae = sum(errors) / len(errors) if errors else None
    return n, (correct / n if n else 0.0), mae, len(errors), n_unparsed


def counting_metrics(
    predictions: Sequence[int | None],
    targets: Sequence[int],
    unparsed_value: int | None = None,
) -> CountingMetrics:
    """Accuracy, MAE and a per-target-count breakdown.

    Args:
        predictions: parsed counts, ``None`` where the output had no number.
        targets: true counts, aligned with ``predictions``.
        unparsed_value: count to score an unparsed prediction as in MAE; ``None`` leaves
            unparsed predictions out of MAE (they still count as wrong for accuracy).
    """
    _check_lengths(predictions, targets)
    n, accuracy, mae, mae_n, n_unparsed = _count_scores(predictions, targets, unparsed_value)
    per_count = {}
    for count in sorted(set(targets)):
        rows = [(p, t) for p, t in zip(predictions, targets, strict=True) if t == count]
        sub_n, sub_acc, sub_mae, _, sub_unparsed = _count_scores(
            [p for p, _ in rows], [t for _, t in rows], unparsed_value
        )
        per_count[count] = CountBreakdown(n=sub_n, accuracy=sub_acc, mae=sub_mae, n_unparsed=sub_unparsed)
    return CountingMetrics(
        n=n, accuracy=accuracy, mae=mae, mae_n=mae_n, n_unparsed=n_unparsed, per_count=per_count
    )


def confusion_matrix(
    predictions: Sequence[int | None], targets: Sequence[int]
) -> tuple[list[int], list[int | str], list[list[int]]]:
    """Counts of (target, prediction) pairs.

    Returns:
        (row_labels, column_labels, matrix): rows are the target counts seen, columns the
        predicted counts seen plus ``"unparsed"`` last when any prediction is ``None``;
        ``matrix[i][j]`` = number of examples with target ``row_labels[i]`` predicted
        ``column_labels[j]``. Shape [n_rows][n_columns]; it sums to ``len(targets)``.
    """
    _check_lengths(predictions, targets)
    rows = sorted(set(targets))
    columns: list[int | str] = sorted({p for p in predictions if p is not None})
    if any(p is None for p in predictions):
        columns.append(UNPARSED_LABEL)
    row_index = {label: i for i, label in enumerate(rows)}
    column_index = {label: j for j, label in enumerate(columns)}
    matrix = [[0] * len(columns) for _ in rows]
    for p, t in zip(predictions, targets, strict=True):
        matrix[row_index[t]][column_index[UNPARSED_LABEL if p is None else p]] += 1
    return rows, columns, matrix


def choice_metrics(
    predictions: Sequence[str | None],
    targets: Sequence[str],
    categories: Sequence[str | None] | None = None,
) -> ChoiceMetrics:
    """Accuracy of option letters, overall and per category (e.g. MMMU subject) when given."""
    _check_lengths(predictions, targets)
    n = len(targets)
    correct = [p is not None and p == t for p, t in zip(predictions, targets, strict=True)]
    per_category: dict[str, dict[str, float | int]] = {}
    if categories is not None:
        _check_lengths(categories, targets)
        for category in sorted({c for c in categories if c is not None}):
            hits = [ok for ok, c in zip(correct, categories, strict=True) if c == category]
            per_category[category] = {"n": len(hits), "accuracy": sum(hits) / len(hits)}
    return ChoiceMetrics(
        n=n,
        accuracy=sum(correct) / n if n else 0.0,
        n_unparsed=sum(p is None for p in predictions),
        per_category=per_category,
    )

"""Scores for parsed answers: counting accuracy, MAE, per-count breakdown, confusion matrix,
and multiple-choice accuracy.

An unparsed prediction (``None``) is always scored wrong for accuracy and always reported
(``n_unparsed``). For MAE it has no value: by default MAE is over the parsed predictions
only (``mae_n`` says how many); pass ``unparsed_value`` (e.g. 0) to score it as that count.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

from vlens.utils.errors import UserInputError

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
    # mean teacher-forced log-probability of the target answer (vlens.core.answers), when scored
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
        raise UserInputError(f"got {len(predictions)} predictions for {len(targets)} targets; they must pair up")


def _count_scores(predictions: Sequence[int | None], targets: Sequence[int], unparsed_value: int | None):
    """(n, accuracy, mae, mae_n, n_unparsed) for aligned predictions and targets."""
    n = len(targets)
    correct = sum(p is not None and p == t for p, t in zip(predictions, targets, strict=True))
    n_unparsed = sum(p is None for p in predictions)
    scored = [(unparsed_value if p is None else p, t) for p, t in zip(predictions, targets, strict=True)]
    errors = [abs(p - t) for p, t in scored if p is not None]  # unparsed: unparsed_value, or left out
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
    predictions: Sequence[int | None],
    targets: Sequence[int],
    labels: Sequence[int] | None = None,
    other_label: str = UNPARSED_LABEL,
) -> tuple[list[int], list[int | str], list[list[int]]]:
    """Counts of (target, prediction) pairs: the one confusion matrix of vlens (reports, figures).

    Args:
        labels: the classes in order. Default: rows are the target counts seen and columns the
            parsed predictions seen. Given: rows and columns are `labels` (a target outside them
            is an error).
        other_label: the last column's name, added only when a prediction is unparsed (``None``)
            or outside the columns.

    Returns:
        (row_labels, column_labels, matrix): ``matrix[i][j]`` = number of examples with target
        ``row_labels[i]`` predicted ``column_labels[j]``; shape [n_rows][n_columns]; it sums to
        ``len(targets)``.
    """
    _check_lengths(predictions, targets)
    if labels is None:
        rows = sorted(set(targets))
        columns: list[int | str] = sorted({p for p in predictions if p is not None})
    else:
        rows, columns = list(labels), list(labels)
        outside = sorted({t for t in targets if t not in rows})
        if outside:
            raise UserInputError(f"targets {outside} are not in labels {rows}")
    row_index = {label: i for i, label in enumerate(rows)}
    column_index = {label: j for j, label in enumerate(columns)}
    if any(p is None or p not in column_index for p in predictions):
        column_index[other_label] = len(columns)
        columns.append(other_label)
    matrix = [[0] * len(columns) for _ in rows]
    for p, t in zip(predictions, targets, strict=True):
        column = column_index[other_label] if p is None or p not in column_index else column_index[p]
        matrix[row_index[t]][column] += 1
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


SUBITIZING_ACCURACY = 0.8  # a count is "subitized" when the model gets it right this often


def subitizing_limit(per_count_accuracy: dict[int, float], threshold: float = SUBITIZING_ACCURACY) -> int:
    """Largest count c such that every count <= c is answered with accuracy >= threshold (0 if none).

    Example: {1: 1.0, 2: 0.9, 3: 0.5, 4: 0.9} -> 2.
    """
    limit = 0
    for count in sorted(per_count_accuracy):
        if per_count_accuracy[count] < threshold:
            break
        limit = count
    return limit

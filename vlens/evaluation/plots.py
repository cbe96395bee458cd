"""Plotly figure for counting evaluations (needs the ``viz`` extra)."""

from __future__ import annotations

from collections.abc import Sequence

from vlens.evaluation.metrics import confusion_matrix
from vlens.viz.figures import confusion_matrix_figure


def plot_confusion_matrix(
    predictions: Sequence[int | None], targets: Sequence[int], title: str = "Counting confusion matrix"
):
    """Heat map of true count (rows) against predicted count (columns) for an evaluation.

    Rows and columns cover every count that is a target or a parsed prediction, so a
    prediction of 11 for a 1-10 set shows as its own column; unparsed answers (None) go to
    the last column, "other" (`vlens.evaluation.metrics.confusion_matrix`); drawn by
    :func:`vlens.viz.figures.confusion_matrix_figure`.

    Returns:
        a ``plotly.graph_objects.Figure``; cells show the number of examples.
    """
    labels = sorted(set(targets) | {p for p in predictions if p is not None})
    rows, columns, matrix = confusion_matrix(predictions, targets, labels=labels, other_label="other")
    return confusion_matrix_figure(rows, columns, matrix, title=title)

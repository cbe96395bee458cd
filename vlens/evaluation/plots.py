"""Plotly figure for counting evaluations (needs the ``viz`` extra)."""

from __future__ import annotations

from collections.abc import Sequence

from vlens.evaluation.metrics import confusion_matrix


def plot_confusion_matrix(
    predictions: Sequence[int | None], targets: Sequence[int], title: str = "Counting confusion matrix"
):
    """Heat map of true count (rows) against predicted count (columns, "unparsed" last).

    Returns:
        a ``plotly.graph_objects.Figure``; cells show the number of examples.
    """
    try:
        import plotly.graph_objects as go
    except ImportError as error:
        raise ImportError("plot_confusion_matrix needs plotly: pip install 'vlens[viz]'") from error
    rows, columns, matrix = confusion_matrix(predictions, targets)
    figure = go.Figure(
        go.Heatmap(
            z=matrix,
            x=[str(c) for c in columns],
            y=[str(r) for r in rows],
            text=matrix,
            texttemplate="%{text}",
            colorscale="Blues",
            hovertemplate="true %{y}, predicted %{x}: %{z}<extra></extra>",
        )
    )
    figure.update_layout(
        title=title,
        xaxis={"title": "predicted count", "type": "category"},
        yaxis={"title": "true count", "type": "category", "autorange": "reversed"},
    )
    return figure

"""Plotly figures for the analyses: plain tensors / lists + labels in, `go.Figure` out.

Every builder validates shapes and says which argument is wrong; plotly is imported lazily.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch
from jaxtyping import Float, Int
from torch import Tensor

from vlens.viz.checks import as_float_tensor, as_grid, check_labels
from vlens.viz.optional import require_make_subplots, require_plotly

# fixed colours of the head taxonomy's classes (`vlens.lens.taxonomy.HEAD_CLASSES` names them)
HEAD_CLASS_COLORS: dict[str, str] = {
    "visual grounding": "#1f77b4",
    "cross-modal routing": "#ff7f0e",
    "counting aggregation": "#2ca02c",
    "awareness": "#d62728",
    "other": "#e5e5e5",
    "non-finite": "#000000",
}
_FALLBACK_COLORS = ["#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"]


def _heatmap(z: np.ndarray, x_labels, y_labels, title: str, x_title: str, y_title: str, **trace):
    go = require_plotly()
    figure = go.Figure(go.Heatmap(z=z, x=x_labels, y=y_labels, **trace))
    figure.update_layout(title=title, xaxis_title=x_title, yaxis_title=y_title)
    return figure


def layer_head_heatmap(
    values: Float[Tensor, "n_layers n_heads"] | None = None,
    title: str = "",
    value_label: str = "value",
    classes: Int[Tensor, "n_layers n_heads"] | Mapping[tuple[int, int], str] | None = None,
    class_names: Sequence[str] | None = None,
    n_layers: int | None = None,
    n_heads: int | None = None,
    colorscale: str = "RdBu_r",
    zmid: float | None = 0.0,
):
    """Layer x head heatmap of per-head values, or a categorical map of head classes.

    Args:
        values: one number per head (patching effect, ablation damage, VGS, ...). Rows are layers.
        title, value_label: figure title and the name of the value in the colour bar / hover.
        classes: a head taxonomy, either integer class indices into `class_names` per head, or a
            mapping `{(layer, head): class_name}` where unlisted heads are the last class ("other").
            When given, colour shows the class (one legend entry per class) and hover shows values.
        class_names: class names in legend order (the head taxonomy's: `vlens.lens.taxonomy.HEAD_CLASSES`);
            needed with `classes`.
        n_layers, n_heads: the grid size when only a `classes` mapping is given.
        colorscale, zmid: for the value heatmap (diverging around 0 by default).

    Returns:
        A Figure whose `Heatmap` trace has z of shape `[n_layers, n_heads]`.
    """
    go = require_plotly()
    if values is not None:
        values_np = as_float_tensor(values, "values", 2).numpy()
        n_layers, n_heads = values_np.shape
    elif classes is None:
        raise ValueError("give values, classes, or both")
    elif isinstance(classes, Mapping):
        if n_layers is None or n_heads is None:
            raise ValueError("with only a classes mapping, give n_layers and n_heads")
        values_np = None
    else:
        n_layers, n_heads = tuple(torch.as_tensor(classes).shape)
        values_np = None
    layer_labels = [f"L{layer}" for layer in range(n_layers)]
    head_labels = [f"H{head}" for head in range(n_heads)]
    axes = {"x_title": "head", "y_title": "layer"}

    if classes is None:
        return _heatmap(
            values_np,
            head_labels,
            layer_labels,
            title,
            **axes,
            colorscale=colorscale,
            zmid=zmid,
            colorbar={"title": {"text": value_label}},
            hovertemplate=f"%{{y}}%{{x}}<br>{value_label}: %{{z:.4g}}<extra></extra>",
        )

    if class_names is None:
        raise ValueError("classes need class_names (e.g. vlens.lens.taxonomy.HEAD_CLASSES), in legend order")
    class_index = _class_index_grid(classes, list(class_names), n_layers, n_heads)
    names = list(class_names)
    colors = [
        HEAD_CLASS_COLORS.get(name, _FALLBACK_COLORS[i % len(_FALLBACK_COLORS)])
        for i, name in enumerate(names)
    ]
    # A stepped colorscale: index i (at (i + 0.5) / n after zmin/zmax) falls in band [i, i+1) / n.
    steps = []
    for i, color in enumerate(colors):
        steps += [[i / len(names), color], [(i + 1) / len(names), color]]
    class_text = np.array(names, dtype=object)[class_index]
    if values_np is None:
        customdata, value_hover = class_text[..., None], ""
    else:
        customdata = np.stack([class_text, values_np.astype(object)], axis=-1)
        value_hover = f"<br>{value_label}: %{{customdata[1]:.4g}}"
    figure = _heatmap(
        class_index,
        head_labels,
        layer_labels,
        title,
        **axes,
        colorscale=steps,
        zmin=-0.5,
        zmax=len(names) - 0.5,
        showscale=False,
        xgap=1,
        ygap=1,
        customdata=customdata,
        hovertemplate=f"%{{y}}%{{x}}: %{{customdata[0]}}{value_hover}<extra></extra>",
    )
    for name, color in zip(names, colors, strict=True):  # heatmaps have no legend: add one per class
        figure.add_trace(
            go.Scatter(
                x=[None],
                y=[None],
                mode="markers",
                name=name,
                marker={"color": color, "symbol": "square", "size": 12},
            )
        )
    figure.update_layout(showlegend=True, plot_bgcolor="white")
    return figure


def _class_index_grid(classes, names: list[str], n_layers: int, n_heads: int) -> np.ndarray:
    if isinstance(classes, Mapping):
        grid = np.full((n_layers, n_heads), len(names) - 1, dtype=np.int64)
        for (layer, head), name in classes.items():
            if name not in names:
                raise ValueError(f"class {name!r} of L{layer}H{head} is not in class_names {names}")
            if not (0 <= layer < n_layers and 0 <= head < n_heads):
                raise IndexError(f"head L{layer}H{head} outside the {n_layers}x{n_heads} grid")
            grid[layer, head] = names.index(name)
        return grid
    grid = torch.as_tensor(classes).long().numpy()
    if grid.shape != (n_layers, n_heads):
        raise ValueError(f"classes has shape {grid.shape}, values has {(n_layers, n_heads)}")
    if grid.min() < 0 or grid.max() >= len(names):
        raise ValueError(f"class indices must lie in [0, {len(names)}) (one per class name)")
    return grid


def layer_region_figure(
    values: Float[Tensor, "n_layers n_regions"],
    region_names: Sequence[str],
    title: str = "",
    value_label: str = "value",
    kind: str = "lines",
    layer_labels: Sequence[str] | None = None,
):
    """Per-layer values for each token region (e.g. overwrite rate of image / text / final tokens).

    Args:
        values: one row per layer, one column per region.
        region_names: one name per column.
        kind: "lines" (one line per region) or "heatmap" (layers on x, regions on y).
        layer_labels: x tick labels (default 0..n_layers-1).

    Returns:
        A Figure with one Scatter per region, or one Heatmap of z `[n_regions, n_layers]`.
    """
    go = require_plotly()
    values_np = as_float_tensor(values, "values", 2).numpy()
    n_layers, n_regions = values_np.shape
    regions = check_labels(region_names, n_regions, "region_names")
    layers = check_labels(layer_labels, n_layers, "layer_labels") or list(range(n_layers))
    if kind == "heatmap":
        return _heatmap(
            values_np.T,
            layers,
            regions,
            title,
            "layer",
            "region",
            colorscale="Viridis",
            colorbar={"title": {"text": value_label}},
            hovertemplate=f"layer %{{x}}, %{{y}}<br>{value_label}: %{{z:.4g}}<extra></extra>",
        )
    if kind != "lines":
        raise ValueError(f"kind must be 'lines' or 'heatmap', got {kind!r}")
    figure = go.Figure(
        [
            go.Scatter(x=layers, y=values_np[:, r], mode="lines+markers", name=regions[r])
            for r in range(n_regions)
        ]
    )
    figure.update_layout(title=title, xaxis_title="layer", yaxis_title=value_label)
    return figure


def image_grid_heatmap(
    values: Float[Tensor, " n_image_tokens"] | Float[Tensor, "rows cols"],
    grid: tuple[int, int] | None = None,
    title: str = "",
    value_label: str = "patch effect",
    colorscale: str = "RdBu_r",
    zmid: float | None = 0.0,
):
    """A per-image-token value (e.g. the effect of patching each patch) laid out on the image grid.

    Args:
        values: row-major per-token values with `grid`, or already `[rows, cols]`.
        grid: `(rows, cols)`; needed for 1-D values.

    Returns:
        A Figure whose Heatmap has z `[rows, cols]`, row 0 at the top as in the image.
    """
    tensor = as_float_tensor(values, "values", (1, 2))
    if tensor.ndim == 1:
        if grid is None:
            raise ValueError("1-D values need grid=(rows, cols)")
        rows, cols = as_grid(grid)
        if tensor.numel() != rows * cols:
            raise ValueError(f"values has {tensor.numel()} entries, grid {rows}x{cols} has {rows * cols}")
        tensor = tensor.reshape(rows, cols)
    elif grid is not None and tuple(tensor.shape) != as_grid(grid):
        raise ValueError(f"values has shape {tuple(tensor.shape)} but grid is {as_grid(grid)}")
    figure = _heatmap(
        tensor.numpy(),
        None,
        None,
        title,
        "column",
        "row",
        colorscale=colorscale,
        zmid=zmid,
        colorbar={"title": {"text": value_label}},
        hovertemplate=f"row %{{y}}, col %{{x}}<br>{value_label}: %{{z:.4g}}<extra></extra>",
    )
    figure.update_yaxes(autorange="reversed", scaleanchor="x")
    return figure


def confusion_matrix_figure(
    rows: Sequence[int],
    columns: Sequence[int | str],
    matrix: Sequence[Sequence[int]],
    title: str = "",
    normalize: bool = False,
):
    """Heatmap of a confusion matrix of counting answers (true count vs predicted count).

    Args:
        rows, columns, matrix: what `vlens.evaluation.metrics.confusion_matrix` returns
            (`[n_rows][n_columns]`, rows the true counts, columns the predictions).
        normalize: show each row as fractions of its target's examples.

    Returns:
        A Figure whose Heatmap z is `[n_rows, n_columns]`.
    """
    values = torch.tensor(matrix, dtype=torch.float64).reshape(len(rows), len(columns))
    if normalize:
        values = values / values.sum(dim=1, keepdim=True).clamp_min(1)
    fmt = ".2f" if normalize else ".0f"
    return (
        _heatmap(
            values.numpy(),
            [str(label) for label in columns],
            [str(label) for label in rows],
            title,
            "predicted",
            "true",
            colorscale="Blues",
            texttemplate=f"%{{z:{fmt}}}",
            hovertemplate=f"true %{{y}}, predicted %{{x}}: %{{z:{fmt}}}<extra></extra>",
        )
        .update_yaxes(autorange="reversed", type="category")
        .update_xaxes(type="category")
    )


def _named_series(series, name: str, length: int | None = None) -> dict[str, np.ndarray]:
    """A single sequence becomes `{name: values}`; a mapping is checked entry by entry."""
    if isinstance(series, Mapping):
        named = {
            str(key): as_float_tensor(value, f"{name}[{key!r}]", 1).numpy() for key, value in series.items()
        }
    else:
        named = {name: as_float_tensor(series, name, 1).numpy()}
    if not named:
        raise ValueError(f"{name} is empty")
    for key, value in named.items():
        if length is not None and len(value) != length:
            raise ValueError(f"{key!r} has {len(value)} values, expected {length}")
    return named


def count_accuracy_figure(
    counts: Sequence[int],
    accuracy: Sequence[float] | Mapping[str, Sequence[float]],
    title: str = "",
    y_label: str = "accuracy",
):
    """Accuracy per ground-truth count, one line per method (e.g. {"baseline": ..., "ours": ...}).

    Returns:
        A Figure with one Scatter per series, each with `len(counts)` points.
    """
    go = require_plotly()
    counts = [int(c) for c in counts]
    series = _named_series(accuracy, "accuracy", len(counts))
    figure = go.Figure(
        [go.Scatter(x=counts, y=values, mode="lines+markers", name=key) for key, values in series.items()]
    )
    figure.update_layout(title=title, xaxis_title="true count", yaxis_title=y_label)
    figure.update_xaxes(tickmode="array", tickvals=counts)
    return figure


def logit_lens_figure(
    probabilities: Sequence[float] | Mapping[str, Sequence[float]] | None = None,
    ranks: Sequence[int] | Mapping[str, Sequence[int]] | None = None,
    title: str = "",
    layer_labels: Sequence[str] | None = None,
):
    """Logit lens per layer: probability (top panel) and rank (bottom, log scale, rank 1 on top).

    Args:
        probabilities, ranks: per-layer values for one token (a sequence) or several
            (`{"3": [...], "5": [...]}`); give either or both, all with the same number of layers.
        layer_labels: x values (default 0..n_layers-1).

    Returns:
        A Figure with one Scatter per token and panel.
    """
    go = require_plotly()
    make_subplots = require_make_subplots()
    panels = [
        (name, data) for name, data in (("probability", probabilities), ("rank", ranks)) if data is not None
    ]
    if not panels:
        raise ValueError("give probabilities, ranks, or both")
    named = {name: _named_series(data, "target") for name, data in panels}
    lengths = {len(values) for series in named.values() for values in series.values()}
    if len(lengths) != 1:
        raise ValueError(
            f"every probability / rank series needs the same number of layers, got {sorted(lengths)}"
        )
    n_layers = lengths.pop()
    layers = check_labels(layer_labels, n_layers, "layer_labels") or list(range(n_layers))
    figure = make_subplots(rows=len(panels), cols=1, shared_xaxes=True, vertical_spacing=0.08)
    palette = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf"]
    for row, (panel, _) in enumerate(panels, start=1):
        for index, (token, values) in enumerate(named[panel].items()):
            figure.add_trace(
                go.Scatter(
                    x=layers,
                    y=values,
                    mode="lines+markers",
                    name=token,
                    legendgroup=token,
                    showlegend=row == 1,
                    line={"color": palette[index % len(palette)]},
                ),
                row=row,
                col=1,
            )
        if panel == "rank":
            figure.update_yaxes(title_text="rank", type="log", autorange="reversed", row=row, col=1)
        else:
            figure.update_yaxes(title_text="probability", range=[0, 1.02], row=row, col=1)
    figure.update_xaxes(title_text="layer", row=len(panels), col=1)
    figure.update_layout(title=title)
    return figure


def jaccard_matrix_figure(
    matrix: Float[Tensor, "n_tasks n_tasks"],
    task_names: Sequence[str],
    title: str = "",
):
    """Jaccard similarity of the top-k head sets of several tasks, values written in the cells.

    Returns:
        A Figure whose Heatmap z is `[n_tasks, n_tasks]` on a fixed 0..1 colour range.
    """
    values = as_float_tensor(matrix, "matrix", 2).numpy()
    if values.shape[0] != values.shape[1]:
        raise ValueError(f"matrix must be square, got {values.shape}")
    names = check_labels(task_names, values.shape[0], "task_names")
    figure = _heatmap(
        values,
        names,
        names,
        title,
        "task",
        "task",
        colorscale="Viridis",
        zmin=0.0,
        zmax=1.0,
        texttemplate="%{z:.2f}",
        hovertemplate="%{y} vs %{x}: %{z:.3f}<extra></extra>",
    )
    return figure.update_yaxes(autorange="reversed")

"""Plotly figures for the analyses: plain tensors / lists + labels in, `go.Figure` out.

Every builder validates shapes and says which argument is wrong; plotly is imported lazily.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
import torch
from jaxtyping import Float, Int
from torch import Tensor

from vlens.utils.errors import UserInputError
from vlens.utils.stats import p_number
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


# Line styles that stay distinguishable when curves coincide: the first is drawn widest, each
# later one narrower with its own dash and marker, so an identical curve still shows underneath.
_LINE_STYLES = (
    {"dash": "solid", "width": 7, "symbol": "circle", "size": 14},
    {"dash": "dash", "width": 4.5, "symbol": "square", "size": 10},
    {"dash": "dot", "width": 3, "symbol": "diamond", "size": 8},
    {"dash": "dashdot", "width": 1.5, "symbol": "x", "size": 6},
)
_PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf"]


def _line_style(index: int) -> dict:
    style = _LINE_STYLES[index % len(_LINE_STYLES)]
    color = _PALETTE[index % len(_PALETTE)]
    return {"line": {"dash": style["dash"], "width": style["width"], "color": color},
            "marker": {"symbol": style["symbol"], "size": style["size"], "color": color}}


def integer_layer_axis(figure, layers: Sequence[int], **selector) -> None:
    """Ticks at the layers only (never at 0.5, 1.5): layers are integers."""
    figure.update_xaxes(tickmode="array", tickvals=list(layers), ticktext=[str(x) for x in layers],
                        title_text="layer", **selector)


def _error_bars(values: np.ndarray, lower, upper, name: str) -> dict | None:
    """plotly `error_y` for an interval [lower, upper] around values (None without an interval)."""
    if lower is None and upper is None:
        return None
    if lower is None or upper is None:
        raise UserInputError(f"give both lower and upper for {name}, or neither")
    low = as_float_tensor(lower, f"lower ({name})", values.ndim).numpy()
    high = as_float_tensor(upper, f"upper ({name})", values.ndim).numpy()
    if low.shape != values.shape or high.shape != values.shape:
        raise UserInputError(f"lower / upper of {name} must have shape {values.shape}")
    return {"type": "data", "symmetric": False, "array": np.clip(high - values, 0, None),
            "arrayminus": np.clip(values - low, 0, None), "thickness": 1.2, "width": 3}


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
    unit: str = "head",
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
        unit: what the columns are: "head" (labels H0, H1, ...) or "expert" (E0, E1, ...: a layer x expert map).

    Returns:
        A Figure whose `Heatmap` trace has z of shape `[n_layers, n_heads]`.
    """
    go = require_plotly()
    if values is not None:
        values_np = as_float_tensor(values, "values", 2).numpy()
        n_layers, n_heads = values_np.shape
    elif classes is None:
        raise UserInputError("give values, classes, or both")
    elif isinstance(classes, Mapping):
        if n_layers is None or n_heads is None:
            raise UserInputError("with only a classes mapping, give n_layers and n_heads")
        values_np = None
    else:
        n_layers, n_heads = tuple(torch.as_tensor(classes).shape)
        values_np = None
    layer_labels = [f"L{layer}" for layer in range(n_layers)]
    head_labels = [f"{unit[:1].upper()}{head}" for head in range(n_heads)]
    axes = {"x_title": unit, "y_title": "layer"}

    if classes is None and values_np is not None:  # (values_np is None only with classes)
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
        raise UserInputError("classes need class_names (e.g. vlens.lens.taxonomy.HEAD_CLASSES), in legend order")
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
    present = set(np.unique(class_index).tolist())
    for index, (name, color) in enumerate(zip(names, colors, strict=True)):
        if index not in present:  # a legend entry only for classes some head has: empty classes are not shown
            continue
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
                raise UserInputError(f"class {name!r} of L{layer}H{head} is not in class_names {names}")
            if not (0 <= layer < n_layers and 0 <= head < n_heads):
                raise IndexError(f"head L{layer}H{head} outside the {n_layers}x{n_heads} grid")
            grid[layer, head] = names.index(name)
        return grid
    grid = torch.as_tensor(classes).long().numpy()
    if grid.shape != (n_layers, n_heads):
        raise UserInputError(f"classes has shape {grid.shape}, values has {(n_layers, n_heads)}")
    if grid.min() < 0 or grid.max() >= len(names):
        raise UserInputError(f"class indices must lie in [0, {len(names)}) (one per class name)")
    return grid


def layer_region_figure(
    values: Float[Tensor, "n_layers n_regions"],
    region_names: Sequence[str],
    title: str = "",
    value_label: str = "value",
    kind: str = "lines",
    layer_labels: Sequence[str] | None = None,
    lower: Float[Tensor, "n_layers n_regions"] | None = None,
    upper: Float[Tensor, "n_layers n_regions"] | None = None,
):
    """Per-layer values for each token region (e.g. overwrite rate of image / text / final tokens).

    Args:
        values: one row per layer, one column per region.
        region_names: one name per column.
        kind: "lines" (one line per region) or "heatmap" (layers on x, regions on y).
        layer_labels: the layer numbers (default 0..n_layers-1); integer ticks only.
        lower, upper: an interval per value (e.g. `vlens.utils.stats.wilson_interval` over pairs), drawn
            as error bars.

    Returns:
        A Figure with one Scatter per region (each its own dash, marker and width, so coinciding
        curves stay visible), or one Heatmap of z `[n_regions, n_layers]`.
    """
    go = require_plotly()
    values_np = as_float_tensor(values, "values", 2).numpy()
    n_layers, n_regions = values_np.shape
    regions = check_labels(region_names, n_regions, "region_names")
    labels = check_labels(layer_labels, n_layers, "layer_labels")
    layers = [int(x) for x in labels] if labels is not None else list(range(n_layers))
    if kind == "heatmap":
        figure = _heatmap(
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
        integer_layer_axis(figure, layers)
        return figure
    if kind != "lines":
        raise UserInputError(f"kind must be 'lines' or 'heatmap', got {kind!r}")
    errors = _error_bars(values_np, lower, upper, "values")
    figure = go.Figure(
        [
            go.Scatter(x=layers, y=values_np[:, r], mode="lines+markers", name=regions[r],
                       error_y=None if errors is None else {**errors, "array": errors["array"][:, r],
                                                            "arrayminus": errors["arrayminus"][:, r]},
                       hovertemplate=f"{regions[r]}, layer %{{x}}: %{{y:.3f}}<extra></extra>",
                       **_line_style(r))
            for r in range(n_regions)
        ]
    )
    figure.update_layout(title=title, yaxis_title=value_label)
    integer_layer_axis(figure, layers)
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
            raise UserInputError("1-D values need grid=(rows, cols)")
        rows, cols = as_grid(grid)
        if tensor.numel() != rows * cols:
            raise UserInputError(f"values has {tensor.numel()} entries, grid {rows}x{cols} has {rows * cols}")
        tensor = tensor.reshape(rows, cols)
    elif grid is not None and tuple(tensor.shape) != as_grid(grid):
        raise UserInputError(f"values has shape {tuple(tensor.shape)} but grid is {as_grid(grid)}")
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
        raise UserInputError(f"{name} is empty")
    for key, value in named.items():
        if length is not None and len(value) != length:
            raise UserInputError(f"{key!r} has {len(value)} values, expected {length}")
    return named


def count_accuracy_figure(
    counts: Sequence[int],
    accuracy: Sequence[float] | Mapping[str, Sequence[float]],
    title: str = "",
    y_label: str = "accuracy",
    lower: Sequence[float] | Mapping[str, Sequence[float]] | None = None,
    upper: Sequence[float] | Mapping[str, Sequence[float]] | None = None,
):
    """Accuracy per ground-truth count, one line per method (e.g. {"baseline": ..., "ours": ...}).

    lower, upper: an interval per point (same shape as `accuracy`, e.g. Wilson 95% intervals from
    `vlens.utils.stats.wilson_interval`), drawn as error bars.

    Returns:
        A Figure with one Scatter per series, each with `len(counts)` points.
    """
    go = require_plotly()
    counts = [int(c) for c in counts]
    series = _named_series(accuracy, "accuracy", len(counts))
    lows = None if lower is None else _named_series(lower, next(iter(series)), len(counts))
    highs = None if upper is None else _named_series(upper, next(iter(series)), len(counts))
    traces = []
    for index, (key, values) in enumerate(series.items()):
        errors = None
        if lows is not None or highs is not None:
            if lows is None or highs is None or key not in lows or key not in highs:
                raise UserInputError(f"give lower and upper for every series (missing for {key!r})")
            errors = _error_bars(values, lows[key], highs[key], key)
        traces.append(go.Scatter(x=counts, y=values, mode="lines+markers", name=key, error_y=errors,
                                 line={"color": _PALETTE[index % len(_PALETTE)]}))
    figure = go.Figure(traces)
    figure.update_layout(title=title, xaxis_title="true count", yaxis_title=y_label)
    figure.update_xaxes(tickmode="array", tickvals=counts)
    return figure


def logit_lens_figure(
    probabilities: Sequence[float] | Mapping[str, Sequence[float]] | None = None,
    ranks: Sequence[int] | Mapping[str, Sequence[int]] | None = None,
    title: str = "",
    layer_labels: Sequence[str] | None = None,
    probability_interval: tuple | None = None,
    rank_interval: tuple | None = None,
):
    """Logit lens per layer: probability (top panel) and rank (bottom, log scale, rank 1 on top).

    Args:
        probabilities, ranks: per-layer values for one token (a sequence) or several
            (`{"3": [...], "5": [...]}`); give either or both, all with the same number of layers.
        layer_labels: the layer numbers (default 0..n_layers-1); ticks at integers only.
        probability_interval, rank_interval: `(lower, upper)` per value (same structure as the
            values), drawn as error bars: e.g. a bootstrap interval of the mean probability over
            examples, the quartiles of the rank.

    Returns:
        A Figure with one Scatter per token and panel.
    """
    go = require_plotly()
    make_subplots = require_make_subplots()
    panels = [
        (name, data, interval)
        for name, data, interval in (("probability", probabilities, probability_interval),
                                     ("rank", ranks, rank_interval))
        if data is not None
    ]
    if not panels:
        raise UserInputError("give probabilities, ranks, or both")
    named = {name: _named_series(data, "target") for name, data, _ in panels}
    lengths = {len(values) for series in named.values() for values in series.values()}
    if len(lengths) != 1:
        raise UserInputError(
            f"every probability / rank series needs the same number of layers, got {sorted(lengths)}"
        )
    n_layers = lengths.pop()
    labels = check_labels(layer_labels, n_layers, "layer_labels")
    layers = [int(x) for x in labels] if labels is not None else list(range(n_layers))
    figure = make_subplots(rows=len(panels), cols=1, shared_xaxes=True, vertical_spacing=0.08)
    for row, (panel, _, interval) in enumerate(panels, start=1):
        bounds = None
        if interval is not None:
            first = next(iter(named[panel]))
            bounds = (_named_series(interval[0], first, n_layers), _named_series(interval[1], first, n_layers))
        for index, (token, values) in enumerate(named[panel].items()):
            errors = None if bounds is None else _error_bars(values, bounds[0][token], bounds[1][token], token)
            figure.add_trace(
                go.Scatter(
                    x=layers,
                    y=values,
                    mode="lines+markers",
                    name=token,
                    legendgroup=token,
                    showlegend=row == 1,
                    error_y=errors,
                    line={"color": _PALETTE[index % len(_PALETTE)]},
                ),
                row=row,
                col=1,
            )
        if panel == "rank":
            # explicit 1-2-5 ticks: plotly's own log ticks label every digit 2..9, which run into each other
            largest = max((v for series in named[panel].values() for v in series if v == v), default=1)
            if bounds is not None:
                largest = max([largest, *(v for series in bounds[1].values() for v in series if v == v)])
            ticks = [m * 10**e for e in range(0, len(str(int(largest))) + 1) for m in (1, 2, 5)]
            ticks = [t for t in ticks if t <= max(largest, 1) * 2] or [1]
            figure.update_yaxes(title_text="rank", type="log", autorange="reversed", tickvals=ticks,
                                ticktext=[str(t) for t in ticks], row=row, col=1)
        else:
            figure.update_yaxes(title_text="probability", range=[0, 1.02], row=row, col=1)
    for row in range(1, len(panels) + 1):
        integer_layer_axis(figure, layers, row=row, col=1)
    if len(panels) > 1:  # the shared axis is titled once, under the bottom panel
        figure.update_xaxes(title_text="", row=1, col=1)
    figure.update_layout(title=title)
    return figure


def jaccard_matrix_figure(
    matrix: Float[Tensor, "n_tasks n_tasks"],
    task_names: Sequence[str],
    title: str = "",
    retest: Sequence[float] | None = None,
    chance: float | None = None,
    p_values: Float[Tensor, "n_tasks n_tasks"] | None = None,
    p_values_holm: Float[Tensor, "n_tasks n_tasks"] | None = None,
    retest_p_values: Sequence[float] | None = None,
    significance: float = 0.05,
):
    """Jaccard similarity of the top-k head sets of several tasks, values written in the cells.

    Args:
        matrix: the cross-task Jaccard matrix (diagonal 1 by definition).
        retest: per task, the Jaccard of its top-k set on a second independent sample (the
            test-retest reliability); shown on the diagonal instead of 1, and as bars.
        chance: the expected Jaccard of two random top-k sets (`vlens.ablation.chance_jaccard`),
            drawn as a dashed line next to the matrix.
        p_values: per pair, the p-value of its Jaccard under random sets, written under the value;
            p_values_holm: the same Holm-adjusted: a cell below `significance` is written in bold.
        retest_p_values: per task, the p-value of its test-retest Jaccard (on the diagonal).

    Returns:
        Without `retest` / `chance`: a Figure whose Heatmap z is `[n_tasks, n_tasks]` on a fixed
        0..1 colour range. With them: the heatmap (left, if there are >= 2 tasks) and a bar panel
        (right): per task its test-retest Jaccard and its mean Jaccard with the other tasks,
        against the chance line.
    """
    values = as_float_tensor(matrix, "matrix", 2).numpy().copy()
    if values.shape[0] != values.shape[1]:
        raise UserInputError(f"matrix must be square, got {values.shape}")
    n = values.shape[0]
    names = check_labels(task_names, n, "task_names")
    again = None if retest is None else as_float_tensor(retest, "retest", 1).numpy()
    if again is not None and len(again) != n:
        raise UserInputError(f"retest has {len(again)} values for {n} tasks")
    text = np.vectorize(lambda v: "" if np.isnan(v) else f"{v:.2f}")(values).astype(object)
    p = None if p_values is None else as_float_tensor(p_values, "p_values", 2).numpy()
    strong = None if p_values_holm is None else as_float_tensor(p_values_holm, "p_values_holm", 2).numpy() < significance
    if p is not None:
        for i in range(n):
            for j in range(n):
                if i != j and text[i, j] and not np.isnan(p[i, j]):
                    cell = f"{text[i, j]}<br>p {p_number(float(p[i, j]))}"
                    text[i, j] = f"<b>{cell}</b>" if strong is not None and strong[i, j] else cell
    if again is not None:
        np.fill_diagonal(values, again)
        for i in range(n):
            text[i, i] = "" if np.isnan(again[i]) else f"{again[i]:.2f}*"
            if retest_p_values is not None and text[i, i] and math.isfinite(float(retest_p_values[i])):
                text[i, i] += f"<br>p {p_number(float(retest_p_values[i]))}"
    heatmap_trace = {
        "z": values, "x": names, "y": names, "colorscale": "Viridis", "zmin": 0.0, "zmax": 1.0,
        "text": text, "texttemplate": "%{text}", "colorbar": {"title": {"text": "Jaccard"}},
        "hovertemplate": "%{y} vs %{x}: %{z:.3f}<extra></extra>",
    }
    if again is None and chance is None:
        figure = _heatmap(values, names, names, title, "task", "task",
                          **{k: v for k, v in heatmap_trace.items() if k not in ("z", "x", "y")})
        return figure.update_yaxes(autorange="reversed")

    go = require_plotly()
    make_subplots = require_make_subplots()
    with_matrix = n >= 2
    columns = 2 if with_matrix else 1
    subtitles = (["tasks' top-k head sets" + (" (* = same task, 2nd sample)" if again is not None else "")]
                 if with_matrix else []) + ["reliability vs chance"]
    figure = make_subplots(rows=1, cols=columns, column_widths=[0.58, 0.42] if with_matrix else None,
                           subplot_titles=subtitles, horizontal_spacing=0.16)
    if with_matrix:
        heatmap_trace["colorbar"] = {"title": {"text": "Jaccard"}, "x": 0.5, "thickness": 14}
        figure.add_trace(go.Heatmap(**heatmap_trace), row=1, col=1)
        figure.update_yaxes(autorange="reversed", row=1, col=1)
    bar_col = columns
    if again is not None:
        figure.add_trace(go.Bar(x=names, y=again, name="same task, 2nd sample (test-retest)",
                                marker_color="#1f77b4",
                                hovertemplate="%{x}: test-retest %{y:.2f}<extra></extra>"), row=1, col=bar_col)
    if with_matrix:
        off = np.where(np.eye(n, dtype=bool), np.nan, as_float_tensor(matrix, "matrix", 2).numpy())
        figure.add_trace(go.Bar(x=names, y=np.nanmean(off, axis=1), name="mean vs other tasks",
                                marker_color="#ff7f0e",
                                hovertemplate="%{x}: mean vs others %{y:.2f}<extra></extra>"), row=1, col=bar_col)
    if chance is not None:
        figure.add_trace(go.Scatter(x=names, y=[float(chance)] * n, mode="lines", name=f"chance ({chance:.2f})",
                                    line={"dash": "dash", "color": "#444", "width": 2},
                                    hovertemplate=f"random top-k sets: {chance:.3f}<extra></extra>"),
                         row=1, col=bar_col)
    figure.update_yaxes(range=[0, 1.05], title_text="Jaccard", row=1, col=bar_col)
    figure.update_layout(title=title, barmode="group", legend={"orientation": "h", "y": -0.25},
                         margin={"b": 120})
    return figure

"""A circuit as an interactive graph: layers left to right, image regions drawn on the picture.

Columns: the input nodes (each image's thumbnail with one node per image region at its place on
the picture, an anyres image's tiles / newline tokens under it, the text tokens below), then for
each layer its heads (one row per head, labelled H0, H1, ...) and its MLP, then the logits. An edge
is a line from its sender to the node it feeds: width by |score|, red where the score is positive,
blue where negative; the receiving port is the line's dash (queries dotted, keys dashed, values
and MLP / logits inputs solid). Hover an edge's midpoint for its name and score, a node for its
name. The picture keeps its aspect ratio on screen (its box is sized from the figure's pixels).
Scatter traces and a layout image only, so the page uses the small plotly bundle (`vlens.viz.html`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from PIL import Image

from vlens.viz.image_attention import image_to_data_uri
from vlens.viz.optional import require_plotly

POSITIVE, NEGATIVE = "#d62728", "#1f77b4"
PORT_DASH = {"q": "dot", "k": "dash", "v": "solid", "mlp": "solid", "logits": "solid"}
WIDTH_LEVELS = 6
MARGIN = {"l": 20, "r": 20, "t": 60, "b": 50}
IMAGE_PIXELS = 230  # the picture's height on screen (all images together)


@dataclass(frozen=True)
class GraphNode:
    """A node to draw. kind: "tokens", "image", "image_part", "head", "mlp" or "logits"; `box`: for an
    image node the token-grid rows / cols it covers (r0, r1, c0, c1), [start, stop) (None: the whole
    image); an "image_part" (an image's tile, newline or class tokens) is drawn under its picture."""

    name: str
    kind: str
    layer: int = -1
    head: int = 0
    image: int | None = None
    box: tuple[int, int, int, int] | None = None


@dataclass(frozen=True)
class GraphEdge:
    """An edge to draw: from node `sender` into the nodes `targets` through `port` (q/k/v/mlp/logits)."""

    name: str
    sender: str
    targets: tuple[str, ...]
    port: str
    score: float


@dataclass(frozen=True)
class _Frame:
    """The figure's size and data ranges, and the picture boxes (x0, x1, y0, y1) in data units."""

    width: int
    height: int
    x_range: tuple[float, float]
    y_range: tuple[float, float]
    boxes: list[tuple[float, float, float, float]]


def _frame(n_layers: int, n_heads: int, n_images: int, aspect: float) -> _Frame:
    """Sizes so that a picture of width / height `aspect` is drawn undistorted left of the layer columns."""
    top = max(n_heads - 1, 1)
    width, height = max(760, 90 * (2 * n_layers + 1) + 300), max(440, 36 * n_heads + 200)
    y_range = (-0.28 * top - 1.0, top + 0.6)
    plot_w, plot_h = width - MARGIN["l"] - MARGIN["r"], height - MARGIN["t"] - MARGIN["b"]
    per_y = plot_h / (y_range[1] - y_range[0])
    box_h = min(top, IMAGE_PIXELS / per_y) if n_images else 0.0
    gap = 0.06 * top
    each_h = (box_h - gap * (n_images - 1)) / n_images if n_images else 0.0
    each_px_w = each_h * per_y * aspect
    right_edge = 2.6 + 2 * n_layers  # the logits column and a little room
    # the picture's width in data units: its pixel width at the x scale the width itself sets
    box_w = each_px_w * (right_edge - 0.7) / max(plot_w - each_px_w, 1.0)
    x0, x1 = 0.8 - box_w, 0.8
    boxes = []
    centre = top / 2 + box_h / 2
    for i in range(n_images):
        y1 = centre - i * (each_h + gap)
        boxes.append((x0, x1, y1 - each_h, y1))
    return _Frame(width, height, (x0 - 0.1, right_edge), y_range, boxes)


def _layout(nodes: Sequence[GraphNode], n_layers: int, n_heads: int, grids: Sequence[tuple[int, int]],
            frame: _Frame) -> dict[str, tuple[float, float]]:
    """Each node's (x, y)."""
    top = max(n_heads - 1, 1)
    boxes = frame.boxes
    where: dict[str, tuple[float, float]] = {}
    parts = [n for n in nodes if n.kind == "image_part"]
    for node in parts:
        if node.image is not None and node.image < len(boxes):
            x0, x1, y0, _ = boxes[node.image]
            mine = [p for p in parts if p.image == node.image]
            where[node.name] = (x0 + (x1 - x0) * (mine.index(node) + 0.5) / len(mine), y0 - 0.05 * top - 0.15)
    low = min((b[2] for b in boxes), default=top / 2)
    for node in nodes:
        if node.kind == "head":
            where[node.name] = (2.0 + 2 * node.layer, float(top - node.head) if n_heads > 1 else 0.5)
        elif node.kind == "mlp":
            where[node.name] = (3.0 + 2 * node.layer, top / 2)
        elif node.kind == "logits":
            where[node.name] = (2.0 + 2 * n_layers, top / 2)
        elif node.kind == "tokens":
            x0, x1 = boxes[0][:2] if boxes else (0.1, 0.8)
            where[node.name] = ((x0 + x1) / 2, low - 0.14 * top - (0.5 if parts else 0.25))
        elif node.kind == "image" and node.image is not None and node.image < len(boxes):
            x0, x1, y0, y1 = boxes[node.image]
            rows, cols = grids[node.image]
            if node.box is None:
                where[node.name] = ((x0 + x1) / 2, (y0 + y1) / 2)
            else:
                r0, r1, c0, c1 = node.box
                where[node.name] = (x0 + (x1 - x0) * ((c0 + c1) / 2) / cols, y1 - (y1 - y0) * ((r0 + r1) / 2) / rows)
    return where


def circuit_graph_figure(nodes: Sequence[GraphNode], edges: Sequence[GraphEdge], n_layers: int, n_heads: int,
                         grids: Sequence[tuple[int, int]] = (), thumbnail: Image.Image | None = None,
                         title: str = "circuit", value_label: str = "score"):
    """The graph figure (a plotly Figure); `edges` are the ones drawn (e.g. a circuit's), `nodes` every node.

    grids: each image's token grid (rows, cols), for placing image-region nodes on `thumbnail`
    (the first image's picture; later images get an empty box).
    """
    go = require_plotly()
    aspect = thumbnail.width / thumbnail.height if thumbnail is not None else (grids[0][1] / grids[0][0] if grids else 1.0)
    frame = _frame(n_layers, n_heads, len(grids), aspect)
    where = _layout(nodes, n_layers, n_heads, grids, frame)
    figure = go.Figure()
    for index, (x0, x1, y0, y1) in enumerate(frame.boxes):
        figure.add_shape(type="rect", x0=x0, x1=x1, y0=y0, y1=y1, line={"color": "#999", "width": 1})
        if thumbnail is not None and index == 0:
            figure.add_layout_image(source=image_to_data_uri(thumbnail.convert("RGB")), xref="x", yref="y", x=x0,
                                    y=y1, sizex=x1 - x0, sizey=y1 - y0, sizing="stretch", layer="below",
                                    opacity=0.9)
    largest = max((abs(e.score) for e in edges), default=0.0) or 1.0
    groups: dict[tuple[bool, int, str], tuple[list, list]] = {}
    mids_x, mids_y, mids_text, mids_colour = [], [], [], []
    touched: set[str] = set()
    for edge in edges:
        if edge.sender not in where:
            continue
        sx, sy = where[edge.sender]
        level = min(WIDTH_LEVELS - 1, int(abs(edge.score) / largest * WIDTH_LEVELS))
        xs, ys = groups.setdefault((edge.score >= 0, level, PORT_DASH.get(edge.port, "solid")), ([], []))
        for target in edge.targets:
            if target not in where:
                continue
            tx, ty = where[target]
            tx, ty = tx - 0.18, ty + {"q": 0.1, "k": 0.0, "v": -0.1}.get(edge.port, 0.0)
            xs += [sx, tx, None]
            ys += [sy, ty, None]
            mids_x.append((sx + tx) / 2)
            mids_y.append((sy + ty) / 2)
            mids_text.append(f"{edge.name}<br>{value_label}: {edge.score:.4g}")
            mids_colour.append(POSITIVE if edge.score >= 0 else NEGATIVE)
            touched.update((edge.sender, target))
    shown_sign: set[bool] = set()
    for (positive, level, dash), (xs, ys) in sorted(groups.items(), key=lambda item: item[0][1]):
        figure.add_trace(go.Scatter(
            x=xs, y=ys, mode="lines", hoverinfo="skip", opacity=0.75,
            line={"color": POSITIVE if positive else NEGATIVE, "width": 0.8 + 1.4 * level, "dash": dash},
            name=f"{value_label} {'> 0' if positive else '< 0'}", legendgroup="pos" if positive else "neg",
            showlegend=positive not in shown_sign))
        shown_sign.add(positive)
    if mids_x:
        figure.add_trace(go.Scatter(x=mids_x, y=mids_y, mode="markers", text=mids_text, hoverinfo="text",
                                    marker={"size": 7, "color": mids_colour, "opacity": 0.35}, showlegend=False))
    symbols = {"head": "circle", "mlp": "square", "logits": "diamond", "tokens": "circle", "image": "circle",
               "image_part": "triangle-up"}
    for kind in ("image", "image_part", "tokens", "head", "mlp", "logits"):
        chosen = [n for n in nodes if n.kind == kind and n.name in where]
        if not chosen:
            continue
        active = [n.name in touched for n in chosen]
        small = kind in ("image", "image_part")
        labelled = kind in ("mlp", "logits", "tokens")
        figure.add_trace(go.Scatter(
            x=[where[n.name][0] for n in chosen], y=[where[n.name][1] for n in chosen],
            mode="markers+text" if labelled else "markers", text=[n.name for n in chosen] if labelled else None,
            textposition="bottom center", hovertext=[n.name for n in chosen], hoverinfo="text",
            marker={"symbol": symbols[kind], "size": [(9 if a else 5) if small else (11 if a else 6) for a in active],
                    "color": ["#222" if a else "#bbb" for a in active], "line": {"color": "white", "width": 1}},
            showlegend=False))
    top = max(n_heads - 1, 1)
    for h in range(n_heads):  # row labels of the head columns
        figure.add_annotation(x=1.3, y=float(top - h) if n_heads > 1 else 0.5, text=f"H{h}", showarrow=False,
                              font={"size": 9, "color": "#777"}, xanchor="right")
    ticks = [(sum(frame.boxes[0][:2]) / 2 if frame.boxes else 0.45, "inputs")]
    for layer in range(n_layers):
        ticks += [(2.0 + 2 * layer, f"L{layer} heads"), (3.0 + 2 * layer, f"MLP{layer}")]
    ticks.append((2.0 + 2 * n_layers, "logits"))
    figure.update_layout(
        title=title, plot_bgcolor="white", hovermode="closest", width=frame.width, height=frame.height,
        xaxis={"tickvals": [t[0] for t in ticks], "ticktext": [t[1] for t in ticks], "showgrid": False,
               "zeroline": False, "range": list(frame.x_range), "fixedrange": False},
        yaxis={"visible": False, "range": list(frame.y_range)},
        legend={"orientation": "h", "y": -0.1}, margin=MARGIN,
    )
    return figure

"""A circuit as an interactive graph: layers left to right, image regions drawn on the picture.

Columns: the input nodes (the image thumbnail with one node per image region at its place on
the picture, and the text tokens below it), then for each layer its heads (one row per head)
and its MLP, then the logits. An edge is a line from its sender to the node it feeds: width by
|score|, red where the score is positive, blue where negative; the receiving port is the line's
dash (queries dotted, keys dashed, values and MLP / logits inputs solid). Hover an edge's
midpoint for its name and score, a node for its name. Scatter traces and a layout image only, so
the page uses the small plotly bundle (`vlens.viz.html`).
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
IMAGE_LEFT, IMAGE_RIGHT = -2.4, -0.2  # the input column's picture, in x units of the layer columns


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


def _layout(nodes: Sequence[GraphNode], n_layers: int, n_heads: int, grids: Sequence[tuple[int, int]]):
    """Node positions and the picture boxes (x0, x1, y0, y1) of each image."""
    top = max(n_heads - 1, 1)
    n_images = max(len(grids), 1)
    gap = 0.08 * top
    height = (top - gap * (n_images - 1)) / n_images
    boxes = []
    for i in range(len(grids)):
        y1 = top - i * (height + gap)
        boxes.append((IMAGE_LEFT, IMAGE_RIGHT, y1 - height, y1))
    where: dict[str, tuple[float, float]] = {}
    parts = [n for n in nodes if n.kind == "image_part"]
    for node in parts:
        if node.image is not None and node.image < len(boxes):
            x0, x1, y0, _ = boxes[node.image]
            mine = [p for p in parts if p.image == node.image]
            k = mine.index(node)
            where[node.name] = (x0 + (x1 - x0) * (k + 0.5) / len(mine), y0 - 0.06 * top - 0.1)
    for node in nodes:
        if node.kind == "head":
            where[node.name] = (2.0 + 2 * node.layer, float(top - node.head) if n_heads > 1 else 0.5)
        elif node.kind == "mlp":
            where[node.name] = (3.0 + 2 * node.layer, top / 2)
        elif node.kind == "logits":
            where[node.name] = (2.0 + 2 * n_layers, top / 2)
        elif node.kind == "tokens":
            where[node.name] = ((IMAGE_LEFT + IMAGE_RIGHT) / 2, -0.12 * top - 0.4)
        elif node.kind == "image" and node.image is not None and node.image < len(boxes):
            x0, x1, y0, y1 = boxes[node.image]
            rows, cols = grids[node.image]
            if node.box is None:
                where[node.name] = ((x0 + x1) / 2, (y0 + y1) / 2)
            else:
                r0, r1, c0, c1 = node.box
                cx = x0 + (x1 - x0) * ((c0 + c1) / 2) / cols
                cy = y1 - (y1 - y0) * ((r0 + r1) / 2) / rows
                where[node.name] = (cx, cy)
    return where, boxes


def circuit_graph_figure(nodes: Sequence[GraphNode], edges: Sequence[GraphEdge], n_layers: int, n_heads: int,
                         grids: Sequence[tuple[int, int]] = (), thumbnail: Image.Image | None = None,
                         title: str = "circuit", value_label: str = "score"):
    """The graph figure (a plotly Figure); `edges` are the ones drawn (e.g. a circuit's), `nodes` every node.

    grids: each image's token grid (rows, cols), for placing image-region nodes on `thumbnail`.
    """
    go = require_plotly()
    where, boxes = _layout(nodes, n_layers, n_heads, grids)
    figure = go.Figure()
    for x0, x1, y0, y1 in boxes:
        figure.add_shape(type="rect", x0=x0, x1=x1, y0=y0, y1=y1, line={"color": "#999", "width": 1})
        if thumbnail is not None:
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
        key = (edge.score >= 0, level, PORT_DASH.get(edge.port, "solid"))
        xs, ys = groups.setdefault(key, ([], []))
        for target in edge.targets:
            if target not in where:
                continue
            tx, ty = where[target]
            offset = {"q": 0.1, "k": 0.0, "v": -0.1}.get(edge.port, 0.0)
            tx, ty = tx - 0.18, ty + offset
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
        figure.add_trace(go.Scatter(
            x=[where[n.name][0] for n in chosen], y=[where[n.name][1] for n in chosen],
            mode="markers+text" if kind in ("mlp", "logits", "tokens") else "markers",
            text=[n.name for n in chosen] if kind in ("mlp", "logits", "tokens") else None,
            textposition="bottom center", hovertext=[n.name for n in chosen], hoverinfo="text",
            marker={"symbol": symbols[kind], "size": [11 if a else 6 for a in active] if kind not in ("image", "image_part")
                    else [9 if a else 5 for a in active],
                    "color": ["#222" if a else "#bbb" for a in active],
                    "line": {"color": "white", "width": 1}},
            showlegend=False))
    ticks = [((IMAGE_LEFT + IMAGE_RIGHT) / 2, "inputs")]
    for layer in range(n_layers):
        ticks += [(2.0 + 2 * layer, f"L{layer} heads"), (3.0 + 2 * layer, f"MLP{layer}")]
    ticks.append((2.0 + 2 * n_layers, "logits"))
    top = max(n_heads - 1, 1)
    figure.update_layout(
        title=title, plot_bgcolor="white", hovermode="closest",
        height=max(380, 34 * n_heads + 160), width=max(700, 120 * (n_layers + 2) + 260),
        xaxis={"tickvals": [t[0] for t in ticks], "ticktext": [t[1] for t in ticks], "showgrid": False,
               "zeroline": False, "range": [IMAGE_LEFT - 0.3, 2.6 + 2 * n_layers]},
        yaxis={"visible": False, "range": [-0.2 * top - 1.0, top + 0.5]},
        legend={"orientation": "h", "y": -0.08}, margin={"l": 20, "r": 20, "t": 60, "b": 40},
    )
    return figure

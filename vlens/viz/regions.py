"""The tokens a region selects, drawn over the image: one panel per view of the image (the whole-image
view, the tiles together, any other view), each selected token's pixel box filled with an opacity that
grows with its coverage (`inputs.regions.from_box(...).plot(image)`)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from jaxtyping import Float, Int
from PIL import Image
from torch import Tensor

from vlens.utils.errors import UserInputError
from vlens.viz.checks import as_float_tensor, check_labels
from vlens.viz.image_attention import image_to_data_uri
from vlens.viz.optional import require_make_subplots, require_plotly

VIEW_NAMES = {0: "whole-image view", 1: "tiles"}


def token_selection_figure(
    image: Image.Image,
    boxes: Float[Tensor, "n 4"],
    coverage: Float[Tensor, " n"],
    labels: Sequence[str],
    views: Int[Tensor, " n"] | None = None,
    region: Sequence[float] | None = None,
    title: str = "",
    color: str = "#e4572e",
):
    """A plotly figure of selected tokens over their image.

    Args:
        image: the original image (its pixels are the figure's coordinates).
        boxes: [n, 4] (x0, y0, x1, y1) of each token in original pixels (clipped to the image).
        coverage: [n] each token's covered fraction in [0, 1]: the fill's opacity (0.15 + 0.6 x coverage,
            so buffer tokens with coverage 0 still show).
        labels: n token names, shown on hover with the coverage.
        views: [n] the view of each token (0: whole-image view, 1: tiles, 2+: others): one panel each.
        region: the selecting box (x0, y0, x1, y1), outlined in every panel; None: none.
    """
    go = require_plotly()
    boxes_t = as_float_tensor(boxes, "boxes", 2)
    coverage_t = as_float_tensor(coverage, "coverage", 1)
    if boxes_t.shape[-1] != 4 or len(coverage_t) != len(boxes_t):
        raise UserInputError(f"boxes must be [n, 4] and coverage [n]; got {tuple(boxes_t.shape)} and "
                             f"{tuple(coverage_t.shape)}")
    names = check_labels(labels, len(boxes_t), "labels")
    view_ids = np.zeros(len(boxes_t), dtype=int) if views is None else np.asarray(views, dtype=int).reshape(-1)
    if len(view_ids) != len(boxes_t):
        raise UserInputError(f"views has {len(view_ids)} entries for {len(boxes_t)} tokens")
    panels = sorted(set(view_ids.tolist())) or [0]
    width, height = image.size
    figure = require_make_subplots()(rows=1, cols=len(panels), horizontal_spacing=0.04,
                                     subplot_titles=[VIEW_NAMES.get(v, f"view {v}") for v in panels])
    source = image_to_data_uri(image.convert("RGB"))
    for col, view in enumerate(panels, start=1):
        axis = "" if col == 1 else str(col)
        figure.add_layout_image(source=source, xref=f"x{axis}", yref=f"y{axis}", x=0, y=0, sizex=width, sizey=height,
                                xanchor="left", yanchor="top", sizing="stretch", layer="below")
        chosen = np.flatnonzero(view_ids == view)
        for k in chosen.tolist():
            x0, y0, x1, y1 = boxes_t[k].tolist()
            figure.add_shape(type="rect", x0=x0, y0=y0, x1=x1, y1=y1, xref=f"x{axis}", yref=f"y{axis}",
                             line={"color": color, "width": 1}, fillcolor=color,
                             opacity=0.15 + 0.6 * float(coverage_t[k].clamp(0, 1)))
        if region is not None:
            rx0, ry0, rx1, ry1 = (float(v) for v in region)
            figure.add_shape(type="rect", x0=rx0, y0=ry0, x1=rx1, y1=ry1, xref=f"x{axis}", yref=f"y{axis}",
                             line={"color": "#1f77b4", "width": 2, "dash": "dash"})
        centres = boxes_t[chosen]
        figure.add_trace(go.Scatter(
            x=((centres[:, 0] + centres[:, 2]) / 2).tolist(), y=((centres[:, 1] + centres[:, 3]) / 2).tolist(),
            mode="markers", marker={"size": 6, "opacity": 0}, showlegend=False,
            text=[f"{names[k]}<br>coverage {float(coverage_t[k]):.2f}" for k in chosen.tolist()],
            hoverinfo="text"), row=1, col=col)
        figure.update_xaxes(range=[0, width], showgrid=False, zeroline=False, constrain="domain", row=1, col=col)
        figure.update_yaxes(range=[height, 0], showgrid=False, zeroline=False, scaleanchor=f"x{axis}", row=1, col=col)
    figure.update_layout(title=title or f"{len(boxes_t)} selected tokens", template="plotly_white",
                         width=min(1200, 380 * len(panels) + 80), height=420)
    return figure

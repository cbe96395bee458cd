"""Mixture-of-experts routing by token region: which experts image tokens use and which text tokens use."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from jaxtyping import Float
from torch import Tensor

from vlens.utils.errors import UserInputError
from vlens.viz.checks import as_float_tensor
from vlens.viz.optional import require_make_subplots


def routing_figure(
    shares: Float[Tensor, "n_regions n_layers n_experts"],
    regions: Sequence[str],
    layers: Sequence[int],
    divergence: Float[Tensor, "n_layers"] | None = None,
    title: str = "Expert routing by token region",
):
    """One layer x expert heatmap per region (the share of that region's tokens whose top-k holds the
    expert; one colour scale across the panels), and, when given, a bar per layer of the divergence
    between the regions' routing distributions (e.g. Jensen-Shannon, in bits).

    Returns a plotly Figure: heatmaps first (z [n_layers, n_experts] each), then the bars.
    """
    shares = as_float_tensor(shares, "shares", 3)
    if shares.shape[0] != len(regions) or shares.shape[1] != len(layers):
        raise UserInputError(f"shares {tuple(shares.shape)} do not match {len(regions)} regions x {len(layers)} layers")
    make_subplots = require_make_subplots()
    import plotly.graph_objects as go  # the viz extra (require_make_subplots checked it)

    columns = len(regions) + (divergence is not None)
    widths = [1.0] * len(regions) + ([0.45] if divergence is not None else [])
    titles = [f"{region} tokens" for region in regions] + (["image vs text divergence"] if divergence is not None
                                                            else [])
    figure = make_subplots(rows=1, cols=columns, column_widths=widths, subplot_titles=titles, horizontal_spacing=0.07)
    top = float(torch.nan_to_num(shares, nan=0.0).max()) or 1.0
    layer_labels = [f"L{layer}" for layer in layers]
    expert_labels = [f"E{e}" for e in range(shares.shape[2])]
    for i, region in enumerate(regions):
        figure.add_trace(go.Heatmap(z=shares[i].numpy(), x=expert_labels, y=layer_labels, zmin=0.0, zmax=top,
                                    colorscale="Viridis", showscale=i == 0,
                                    colorbar={"title": {"text": "share of tokens"}},
                                    hovertemplate=f"{region} tokens<br>%{{y}}%{{x}}: %{{z:.3f}}<extra></extra>"),
                         row=1, col=i + 1)
        figure.update_xaxes(title_text="expert", row=1, col=i + 1)
        figure.update_yaxes(title_text="layer" if i == 0 else None, row=1, col=i + 1)
    if divergence is not None:
        values = as_float_tensor(divergence, "divergence", 1)
        figure.add_trace(go.Bar(x=values.numpy(), y=layer_labels, orientation="h", marker={"color": "#d62728"},
                                hovertemplate="%{y}: %{x:.3f} bits<extra></extra>", showlegend=False),
                         row=1, col=columns)
        figure.update_xaxes(title_text="bits", row=1, col=columns)
    figure.update_layout(title=title)
    return figure

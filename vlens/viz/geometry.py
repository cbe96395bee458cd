"""Representation geometry: PCA (torch SVD) and t-SNE of residual vectors, coloured by count.

t-SNE is scikit-learn's (Barnes-Hut, O(n log n): thousands of points in seconds), seeded so a
run is reproducible; it needs the ``analysis`` extra (``pip install 'vlens[analysis]'``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from jaxtyping import Float, Int
from torch import Tensor

from vlens.utils.errors import UserInputError
from vlens.viz.checks import as_float_tensor
from vlens.viz.colormaps import sample_colors
from vlens.viz.optional import require_make_subplots, require_plotly


@dataclass(frozen=True)
class PCAResult:
    """Output of `pca`: projections, unit components, explained-variance ratios and the mean."""

    projected: Float[Tensor, "n n_components"]
    components: Float[Tensor, "n_components d"]
    explained_variance_ratio: Float[Tensor, " n_components"]
    mean: Float[Tensor, " d"]


def pca(vectors: Float[Tensor, "n d"], n_components: int = 2) -> PCAResult:
    """Principal components of a set of vectors (centred SVD, float64 inside).

    Component signs are fixed (largest-magnitude loading positive), so results are reproducible.
    """
    x = as_float_tensor(vectors, "vectors", 2).double()
    n, d = x.shape
    if not 1 <= n_components <= min(n, d):
        raise UserInputError(f"n_components must be in [1, {min(n, d)}] for {n} vectors of size {d}")
    mean = x.mean(dim=0)
    centred = x - mean
    _, singular_values, right_vectors = torch.linalg.svd(centred, full_matrices=False)
    components = right_vectors[:n_components]
    largest = components.abs().argmax(dim=1)
    signs = torch.sign(components[torch.arange(n_components), largest])
    components = components * signs[:, None]
    variance = singular_values**2
    ratio = variance[:n_components] / variance.sum().clamp_min(torch.finfo(variance.dtype).tiny)
    return PCAResult((centred @ components.T).float(), components.float(), ratio.float(), mean.float())


def tsne(
    vectors: Float[Tensor, "n d"],
    n_components: int = 2,
    perplexity: float | None = None,
    n_iter: int = 1000,
    seed: int = 0,
    init: str = "pca",
) -> Float[Tensor, "n n_components"]:
    """t-SNE embedding by scikit-learn (deterministic for a given seed).

    Args:
        vectors: the points, e.g. final-position residuals of one layer.
        perplexity: effective neighbours; default min(30, (n - 1) / 3). Must be < n.
        n_iter: optimisation steps (>= 250: the first 250 use early exaggeration).
        seed: seeds the optimisation (and the initialisation when init="random").
        init: "pca" (stable, the default) or "random".
    Returns the embedding, centred, float32 [n, n_components].
    """
    x = as_float_tensor(vectors, "vectors", 2).double()
    n = x.shape[0]
    if n < 4:
        raise UserInputError(f"t-SNE needs at least 4 points, got {n}")
    perplexity = min(30.0, (n - 1) / 3) if perplexity is None else float(perplexity)
    if not 1 < perplexity < n:
        raise UserInputError(f"perplexity must be in (1, {n}) for {n} points, got {perplexity}")
    if n_iter < 250:
        raise UserInputError("n_iter must be at least 250")
    if init not in ("pca", "random"):
        raise UserInputError(f"init must be 'pca' or 'random', got {init!r}")
    try:
        from sklearn.manifold import TSNE
    except ImportError as error:
        raise ImportError("t-SNE needs scikit-learn: pip install 'vlens[analysis]'") from error
    from threadpoolctl import threadpool_limits  # a scikit-learn dependency

    method = "barnes_hut" if n_components < 4 else "exact"  # Barnes-Hut supports up to 3 dimensions
    # one BLAS thread: the PCA initialisation of a few hundred points is tiny, and OpenBLAS's threads spin
    # for about a second per call when the other cores are busy (a shared machine)
    with threadpool_limits(limits=1, user_api="blas"):
        embedding = TSNE(n_components=n_components, perplexity=perplexity, max_iter=n_iter, init=init,
                         random_state=seed, method=method).fit_transform(x.cpu().numpy())
    y = torch.from_numpy(embedding)
    return (y - y.mean(dim=0)).float()


def project(vectors: Float[Tensor, "n d"], method: str = "pca", seed: int = 0) -> Float[Tensor, "n 2"]:
    """2-D projection by "pca" or "tsne"."""
    if method == "pca":
        return pca(vectors, 2).projected
    if method == "tsne":
        return tsne(vectors, 2, seed=seed)
    raise UserInputError(f"method must be 'pca' or 'tsne', got {method!r}")


def _per_layer(representations) -> dict[int, Tensor]:
    if isinstance(representations, Mapping):
        return {int(k): as_float_tensor(v, f"representations[{k}]", 2) for k, v in representations.items()}
    if isinstance(representations, Tensor):
        stacked = as_float_tensor(representations, "representations", 3)
        return dict(enumerate(stacked))
    return {i: as_float_tensor(v, f"representations[{i}]", 2) for i, v in enumerate(representations)}


def representation_geometry_figure(
    representations: Float[Tensor, "n_layers n d_model"] | Mapping[int, Float[Tensor, "n d_model"]],
    counts: Int[Tensor, " n"] | Sequence[int],
    layers: Sequence[int] | None = None,
    method: str = "pca",
    seed: int = 0,
    title: str = "",
    projections: Mapping[int, Float[Tensor, "n 2"]] | None = None,
):
    """One 2-D scatter panel per chosen layer, points coloured by their count.

    Args:
        representations: per layer, one vector per example (e.g. the final-position residual
            from `cache.accumulated_resid(pos_slice=-1)`), stacked or as `{layer: [n, d]}`.
        counts: the ground-truth count of each example.
        layers: which layers to draw (default: up to four evenly spaced, including the last).
        method: "pca" (titles show explained variance) or "tsne".
        seed: for t-SNE.
        projections: 2-D points already computed per layer with `method` (e.g. `tsne(...)` of the
            same vectors and seed), used instead of recomputing them (t-SNE is the slow part).

    Returns:
        A Figure with `len(layers)` panels and one Scatter per (layer, count); each count is one
        legend entry shared by all panels.
    """
    go = require_plotly()
    make_subplots = require_make_subplots()
    by_layer = _per_layer(representations)
    counts = [int(c) for c in (counts.tolist() if isinstance(counts, Tensor) else counts)]
    available = sorted(by_layer)
    if layers is None:
        picks = torch.linspace(0, len(available) - 1, min(4, len(available))).round().long().tolist()
        layers = [available[i] for i in picks]
    missing = [layer for layer in layers if layer not in by_layer]
    if missing:
        raise UserInputError(f"layers {missing} are not in the representations (have {available})")
    for layer in layers:
        if by_layer[layer].shape[0] != len(counts):
            raise UserInputError(f"layer {layer} has {by_layer[layer].shape[0]} vectors for {len(counts)} counts")

    distinct = sorted(set(counts))
    colors = dict(zip(distinct, sample_colors("viridis", len(distinct)), strict=True))
    points, subtitles = {}, []
    for layer in layers:
        if method == "pca":
            result = pca(by_layer[layer], 2)
            points[layer] = result.projected
            pc1, pc2 = (100 * result.explained_variance_ratio).tolist()
            subtitles.append(f"layer {layer}<br>PC1 {pc1:.0f}% · PC2 {pc2:.0f}%")
        else:
            given = None if projections is None else projections.get(layer)
            points[layer] = given if given is not None else project(by_layer[layer], method, seed)
            subtitles.append(f"layer {layer}")

    # Two-line titles in a small font: one-line titles of neighbouring panels ran into each other.
    figure = make_subplots(rows=1, cols=len(layers), subplot_titles=subtitles, horizontal_spacing=0.06)
    figure.update_annotations(font_size=12)
    count_tensor = torch.tensor(counts)
    for column, layer in enumerate(layers, start=1):
        for count in distinct:
            xy = points[layer][count_tensor == count]
            figure.add_trace(
                go.Scatter(
                    x=xy[:, 0].tolist(),
                    y=xy[:, 1].tolist(),
                    mode="markers",
                    name=f"count {count}",
                    legendgroup=str(count),
                    showlegend=column == 1,
                    marker={"color": colors[count], "size": 6},
                    hovertemplate=f"count {count}<extra>layer {layer}</extra>",
                ),
                row=1,
                col=column,
            )
    # the legend in a row under the panels: a column of ten counts needed a scroll bar at this height
    figure.update_layout(title=title, width=max(400, 330 * len(layers)), height=430, margin={"t": 110, "b": 90},
                         legend={"orientation": "h", "yanchor": "top", "y": -0.12, "x": 0})
    return figure

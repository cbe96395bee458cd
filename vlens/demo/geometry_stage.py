"""Stage 8 (representation geometry): PCA and t-SNE of the final-position residual per layer, by count."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from jaxtyping import Float
from torch import Tensor

from vlens.demo.data_stage import CountingSample
from vlens.demo.report_sections import Section
from vlens.demo.settings import DemoSettings
from vlens.lens.corpus import collect_residuals
from vlens.parallel.options import SweepOptions
from vlens.patching import spearman
from vlens.utils.stats import bootstrap_interval, format_interval
from vlens.viz.geometry import pca, representation_geometry_figure, tsne

if TYPE_CHECKING:
    from vlens.core.model import HookedVLM



def count_alignment(projected: Float[Tensor, "n 2"], counts: list[int]) -> float:
    """|Spearman correlation| between the first projected axis and the count (1 = ordered by count)."""
    if len(set(counts)) < 2 or float(projected[:, 0].std()) == 0.0:
        return 0.0
    return abs(spearman(projected[:, 0], torch.tensor(counts, dtype=torch.float64)))


SMALL_COUNTS = 4  # the paper: counts 1-4 form clean clusters, larger counts entangle


def nearest_centroid_hits(vectors: Float[Tensor, "n d"], counts: list[int]) -> Tensor:
    """Per example, whether its nearest count centroid (leave-one-out: itself left out) is its own count.

    A count whose points cluster apart from the others scores near 1; entangled counts score low.
    """
    x = vectors.double()
    labels = torch.tensor(counts)
    classes = sorted(set(counts))
    sums = torch.stack([x[labels == c].sum(0) for c in classes])  # [n_classes, d]
    sizes = torch.tensor([float((labels == c).sum()) for c in classes], dtype=torch.float64)
    own = torch.tensor([classes.index(c) for c in counts])
    centroids = (sums / sizes[:, None]).expand(len(counts), -1, -1).clone()  # [n, n_classes, d]
    rows = torch.arange(len(counts))
    loo_size = (sizes[own] - 1).clamp_min(1)
    centroids[rows, own] = (sums[own] - x) / loo_size[:, None]
    distances = (centroids - x[:, None]).pow(2).sum(-1)
    distances[rows, own] = torch.where(sizes[own] > 1, distances[rows, own], torch.inf)
    return distances.argmin(1) == own


def separation_finding(hits: Tensor, counts: list[int], seed: int = 0) -> dict:
    """Nearest-centroid accuracy of counts <= 4 and > 4 with bootstrap intervals, and what they support."""
    labels = torch.tensor(counts)
    out: dict[str, Any] = {}
    for name, mask in (("small", labels <= SMALL_COUNTS), ("large", labels > SMALL_COUNTS)):
        if int(mask.sum()) == 0:
            return {"statement": "", "small": None, "large": None}
        values = hits[mask].double()
        low, high = bootstrap_interval(values, seed=seed)
        out[name] = {"accuracy": float(values.mean()), "low": float(low), "high": float(high),
                     "text": format_interval(float(values.mean()), float(low), float(high))}
    small, large = out["small"], out["large"]
    if small["low"] > large["high"]:
        verdict = ("counts 1-4 separate more cleanly than larger counts (intervals apart), the paper's picture "
                   "of subitizing")
    elif large["low"] > small["high"]:
        verdict = "larger counts separate more cleanly than 1-4 (intervals apart), unlike the paper's picture"
    else:
        verdict = ("small and large counts are not separated differently (intervals overlap): this does not show "
                   "the paper's split")
    out["statement"] = (f"Nearest-count-centroid accuracy (leave-one-out, full residual) at this layer: counts 1-4 "
                        f"{small['text']}, counts >= 5 {large['text']}: {verdict}.")
    return out


def geometry_sections(model: HookedVLM, samples: list[CountingSample], settings: DemoSettings) -> list[Section]:
    residuals = collect_residuals(model, [(s.image, s.question, s.record) for s in samples], positions="final",
                                  options=SweepOptions(batch_size=settings.batch_size, progress=False)
                                  ).transpose(0, 1)  # [L, n, d]
    counts = [s.count for s in samples]
    layers = list(range(residuals.shape[0]))
    shown = layers if len(layers) <= 4 else None  # the figure picks 4 evenly spaced layers itself
    sections = []
    for method, title, explanation in (
        ("pca", "Representation geometry: PCA per layer",
         "The final-position residual of each counting image projected on its two main directions, per layer, "
         "coloured by true count. |rho| measures how well the first axis orders the counts; an ordering alone is "
         "not the paper's claim, which is that counts 1-4 form clean clusters while larger counts entangle."),
        ("tsne", "Representation geometry: t-SNE per layer",
         "The same residuals embedded by t-SNE (local neighbourhoods kept): images of one count cluster when the "
         "layer separates counts."),
    ):
        projections = {layer: (pca(residuals[layer], 2).projected if method == "pca"
                               else tsne(residuals[layer], 2, seed=settings.seed)) for layer in layers}
        alignment = {layer: count_alignment(projections[layer], counts) for layer in layers}
        best = max(layers, key=lambda layer: alignment[layer])
        numbers: dict[str, int | float] = {"examples": len(counts), "most count-ordered layer": best}
        numbers.update({f"layer {layer} |rho(axis 1, count)|": alignment[layer] for layer in layers})
        if method == "pca":
            separation = separation_finding(nearest_centroid_hits(residuals[best], counts), counts, settings.seed)
            if separation["statement"]:
                explanation = f"{explanation} Layer {best}: {separation['statement']}"
                numbers["counts 1-4 centroid accuracy"] = separation["small"]["text"]
                numbers["counts >= 5 centroid accuracy"] = separation["large"]["text"]
        data = {"counts": counts, "alignment_per_layer": [alignment[layer] for layer in layers],
                "projections": {layer: projections[layer] for layer in layers}}
        if method == "pca":
            data["explained_variance_ratio"] = {layer: pca(residuals[layer], 2).explained_variance_ratio
                                                for layer in layers}
            data["separation"] = separation
        figure = representation_geometry_figure(residuals, counts, layers=shown, method=method, seed=settings.seed,
                                                title=f"Final-position residual, {method.upper()} per layer",
                                                projections=projections)
        figure.update_layout(width=1000)  # fit the report's column (the default grows with the panel count)
        sections.append(Section(key=f"geometry_{method}", title=title, explanation=explanation, figure=figure,
                                numbers=numbers, data=data))
    return sections

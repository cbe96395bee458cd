"""Stage 8 (representation geometry): PCA and t-SNE of the final-position residual per layer, by count."""

from __future__ import annotations

import torch
from jaxtyping import Float
from torch import Tensor

from vlens.demo.data_stage import CountingSample
from vlens.demo.report_sections import Section
from vlens.demo.settings import DemoSettings
from vlens.lens.corpus import collect_residuals
from vlens.patching import spearman
from vlens.viz.geometry import pca, representation_geometry_figure, tsne


def count_alignment(projected: Float[Tensor, "n 2"], counts: list[int]) -> float:
    """|Spearman correlation| between the first projected axis and the count (1 = ordered by count)."""
    if len(set(counts)) < 2 or float(projected[:, 0].std()) == 0.0:
        return 0.0
    return abs(spearman(projected[:, 0], torch.tensor(counts, dtype=torch.float64)))


def geometry_sections(model, samples: list[CountingSample], settings: DemoSettings) -> list[Section]:
    residuals = collect_residuals(model, [(s.image, s.question, s.record) for s in samples], positions="final",
                                  batch_size=settings.batch_size, progress=False).transpose(0, 1)  # [L, n, d]
    counts = [s.count for s in samples]
    layers = list(range(residuals.shape[0]))
    shown = layers if len(layers) <= 4 else None  # the figure picks 4 evenly spaced layers itself
    sections = []
    for method, title, explanation in (
        ("pca", "Representation geometry: PCA per layer",
         "The final-position residual of each counting image projected on its two main directions, per layer, "
         "coloured by true count; a curve ordered by count is the paper's subitizing picture."),
        ("tsne", "Representation geometry: t-SNE per layer",
         "The same residuals embedded by t-SNE (local neighbourhoods kept): images of one count cluster when the "
         "layer separates counts."),
    ):
        projections = {layer: (pca(residuals[layer], 2).projected if method == "pca"
                               else tsne(residuals[layer], 2, seed=settings.seed)) for layer in layers}
        alignment = {layer: count_alignment(projections[layer], counts) for layer in layers}
        best = max(layers, key=lambda layer: alignment[layer])
        numbers = {"examples": len(counts), "most count-ordered layer": best}
        numbers.update({f"layer {layer} |rho(axis 1, count)|": alignment[layer] for layer in layers})
        data = {"counts": counts, "alignment_per_layer": [alignment[layer] for layer in layers],
                "projections": {layer: projections[layer] for layer in layers}}
        if method == "pca":
            data["explained_variance_ratio"] = {layer: pca(residuals[layer], 2).explained_variance_ratio
                                                for layer in layers}
        figure = representation_geometry_figure(residuals, counts, layers=shown, method=method, seed=settings.seed,
                                                title=f"Final-position residual, {method.upper()} per layer")
        figure.update_layout(width=1000)  # fit the report's column (the default grows with the panel count)
        sections.append(Section(key=f"geometry_{method}", title=title, explanation=explanation, figure=figure,
                                numbers=numbers, data=data))
    return sections

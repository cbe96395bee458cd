"""`GenerationAttribution`: per generated token, maps over the image and the logit lens through depth."""

from __future__ import annotations

import html
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import torch
from jaxtyping import Float, Shaped
from PIL import Image
from torch import Tensor

from vlens.circuits.results import decode_image, encode_image
from vlens.patching.attribution import spearman
from vlens.utils.errors import UserInputError
from vlens.utils.finite import json_safe
from vlens.utils.results import Result, nan_tensor
from vlens.viz.image_attention import attention_tiles_figure
from vlens.viz.optional import require_plotly
from vlens.viz.report import Report

ESTIMATES: tuple[str, ...] = ("gradient_x_activation", "attribution_patching")
HTML_FILE = "generation_attribution.html"
MAX_COLUMNS = 8  # tiles per row of a strip


def pearson(a: Tensor, b: Tensor) -> float:
    """Pearson correlation of two same-shaped tensors; NaN when either is constant."""
    x, y = a.detach().flatten().double(), b.detach().flatten().double()
    x, y = x - x.mean(), y - y.mean()
    scale = float(x.norm() * y.norm())
    return float((x * y).sum()) / scale if scale > 0 else float("nan")


def _mean(values: list[float]) -> float:
    finite = [v for v in values if v == v]
    return sum(finite) / len(finite) if finite else float("nan")


@dataclass
class GenerationAttribution(Result):
    """Per generated token k (teacher-forced over prompt + output):

    tokens / token_strs: [n_new] the generated ids and their text; text: the decoded output.
    maps[method][i]: [n_new, rows * cols] per image token of image i (row-major over grids[i]),
        method in ESTIMATES ("gradient_x_activation", "attribution_patching").
    region_maps[method][i]: [n_new, n_regions] the same summed over regions (blocks of region_size x
        region_size tokens, row-major over region_grids[i]), plus "exact": the change of the metric
        (patched minus clean) with that region's inputs at the baseline.
    clean_metric: [n_new] the metric (log-probability or logit of token k); baseline_metric: [n_new] with
        every image token at the baseline.
    lens_prob / lens_rank: [n_new, n_layers] token k's probability and rank (1 = top) read from each
        layer's output by the final norm and unembedding; lens_top: [n_new][n_layers] the top token.
    thumbnails: the prompt's images (small), for the figures.
    """

    kind: ClassVar[str] = "generation_attribution"
    # checked when a file is read: per generated token, and per image (a map per image under each method)
    saved_dims: ClassVar[dict[str, str]] = {"tokens": "n_new", "token_strs": "n_new", "grids": "n_images",
                                            "region_grids": "n_images", "maps[*]": "n_images", "region_maps[*]": "n_images",
                                            "lens_top": "n_new", "lens_top[*]": "n_layers"}

    prompt: str
    tokens: list[int]
    token_strs: list[str]
    text: str
    metric: str
    baseline: str
    grids: list[tuple[int, int]]
    region_size: int
    region_grids: list[tuple[int, int]]
    maps: dict[str, list[Tensor]]
    region_maps: dict[str, list[Tensor]]
    clean_metric: Float[Tensor, " n_new"]
    baseline_metric: Float[Tensor, " n_new"]
    lens_prob: Float[Tensor, "n_new n_layers"] | None = None
    lens_rank: Shaped[Tensor, "n_new n_layers"] | None = None
    lens_top: list[list[str]] | None = None
    settings: dict = field(default_factory=dict)
    thumbnails: list[Image.Image] | None = None

    @property
    def n_new(self) -> int:
        return len(self.tokens)

    def agreement(self, image: int = 0) -> dict[str, dict[str, Any]]:
        """Each estimate against exact patching of the regions of image `image`: per generated token the
        Pearson and Spearman correlation across regions, their means, and the Pearson correlation of
        all (token, region) values together. Empty without exact patching."""
        if "exact" not in self.region_maps:
            return {}
        exact = self.region_maps["exact"][image]
        out: dict[str, dict[str, Any]] = {}
        for method in ESTIMATES:
            estimate = self.region_maps[method][image]
            if exact.shape[1] < 2:
                per_pearson = per_spearman = [float("nan")] * self.n_new
            else:
                per_pearson = [pearson(estimate[k], exact[k]) for k in range(self.n_new)]
                per_spearman = [spearman(estimate[k], exact[k]) for k in range(self.n_new)]
            out[method] = {"pearson_per_token": per_pearson, "spearman_per_token": per_spearman,
                           "pearson_mean": _mean(per_pearson), "spearman_mean": _mean(per_spearman),
                           "pearson_all": pearson(estimate, exact)}
        return out

    def to_dict(self) -> dict:
        return json_safe({
            "prompt": self.prompt, "tokens": self.tokens, "token_strs": self.token_strs, "text": self.text,
            "metric": self.metric, "baseline": self.baseline, "grids": [list(g) for g in self.grids],
            "region_size": self.region_size, "region_grids": [list(g) for g in self.region_grids],
            "definition": "per generated token k: the change of its metric when an image region's inputs are at the "
                          "baseline (exact), its first-order estimate (attribution_patching) and gradient x "
                          "activation, teacher-forced over prompt + output",
            "maps": {m: [x.tolist() for x in maps] for m, maps in self.maps.items()},
            "region_maps": {m: [x.tolist() for x in maps] for m, maps in self.region_maps.items()},
            "agreement_with_exact": {str(i): self.agreement(i) for i in range(len(self.grids))},
            "clean_metric": self.clean_metric.tolist(), "baseline_metric": self.baseline_metric.tolist(),
            "lens_prob": None if self.lens_prob is None else self.lens_prob.tolist(),
            "lens_rank": None if self.lens_rank is None else self.lens_rank.tolist(),
            "lens_top": self.lens_top, "settings": self.settings,
            "thumbnails_png": None if self.thumbnails is None else [encode_image(p) for p in self.thumbnails],
        })

    @classmethod
    def from_dict(cls, data: dict) -> GenerationAttribution:
        def tensors(maps: dict) -> dict[str, list[Tensor]]:
            return {m: [nan_tensor(x, torch.float64).reshape(len(data["tokens"]), -1) for x in per_image] for m, per_image in maps.items()}

        thumbs = data.get("thumbnails_png")
        return cls(prompt=data["prompt"], tokens=list(data["tokens"]), token_strs=list(data["token_strs"]),
                   text=data["text"], metric=data["metric"], baseline=data["baseline"],
                   grids=[(int(g[0]), int(g[1])) for g in data["grids"]], region_size=int(data["region_size"]),
                   region_grids=[(int(g[0]), int(g[1])) for g in data["region_grids"]],
                   maps=tensors(data["maps"]), region_maps=tensors(data["region_maps"]),
                   clean_metric=nan_tensor(data["clean_metric"], torch.float64),
                   baseline_metric=nan_tensor(data["baseline_metric"], torch.float64),
                   lens_prob=None if data.get("lens_prob") is None else nan_tensor(data["lens_prob"], torch.float64),
                   lens_rank=None if data.get("lens_rank") is None else torch.tensor(data["lens_rank"]),
                   lens_top=data.get("lens_top"), settings=dict(data.get("settings") or {}),
                   thumbnails=None if thumbs is None else [p for p in map(decode_image, thumbs) if p is not None])

    def _picture(self, image: int) -> Image.Image:
        if self.thumbnails is not None and image < len(self.thumbnails):
            return self.thumbnails[image]
        rows, cols = self.grids[image]  # no picture kept: the maps on a plain grid of the image's shape
        return Image.new("RGB", (cols * 16, rows * 16), "white")

    def plot(self, method: str = "attribution_patching", image: int = 0):
        """The strip of maps: one tile per generated token over image `image`, on one signed colour scale.
        method: "gradient_x_activation" or "attribution_patching" (per token) or "exact" (per region)."""
        if image >= len(self.grids):
            raise UserInputError(f"image {image}: this result has {len(self.grids)} image(s)")
        if method in self.maps:
            maps, grid = self.maps[method][image], self.grids[image]
        elif method in self.region_maps:
            maps, grid = self.region_maps[method][image], self.region_grids[image]
        else:
            raise UserInputError(f"method {method!r}: this result has {sorted({*self.maps, *self.region_maps})}")
        titles = [f"{k}: {token!r}" for k, token in enumerate(self.token_strs)]
        figure = attention_tiles_figure(self._picture(image), maps, grid, titles=titles,
                                        n_cols=min(MAX_COLUMNS, self.n_new), tile_size=112, signed=True,
                                        value_label=f"change of {self.metric}")
        return figure.update_layout(title=f"{method.replace('_', ' ')} per generated token, image {image}")

    def lens_figure(self):
        """The logit lens through depth: each generated token's probability at each layer's output
        (hover: its rank and the layer's top token)."""
        if self.lens_prob is None or self.lens_rank is None:
            raise UserInputError("this result has no logit lens (it was run with lens=False)")
        go = require_plotly()
        labels = [f"{k}: {token!r}" for k, token in enumerate(self.token_strs)]
        ranks = self.lens_rank.tolist()
        hover = [[f"rank {ranks[k][layer]}, top {self.lens_top[k][layer]!r}" if self.lens_top else
                  f"rank {ranks[k][layer]}" for layer in range(self.lens_prob.shape[1])] for k in range(self.n_new)]
        figure = go.Figure(go.Heatmap(z=self.lens_prob.tolist(), x=list(range(self.lens_prob.shape[1])), y=labels,
                                      zmin=0.0, zmax=1.0, colorscale="Viridis", text=hover,
                                      colorbar={"title": {"text": "p(token)"}},
                                      hovertemplate="%{y}<br>layer %{x}: p=%{z:.3g}<br>%{text}<extra></extra>"))
        return figure.update_layout(title="Logit lens of each generated token through depth",
                                    xaxis={"title": "layer (output of block)"},
                                    yaxis={"autorange": "reversed", "type": "category"})

    def report(self) -> Report:
        """The HTML page: the generated text, a strip of maps per method and image, the logit lens and the
        agreement with exact patching."""
        report = Report("Per-token attribution over the image",
                        f"Prompt: {self.prompt!r}. Metric: {self.metric} of each generated token; baseline: "
                        f"{self.baseline}; regions of {self.region_size}x{self.region_size} tokens.")
        spans = "".join(f'<span title="token {k}: {self.metric} {float(self.clean_metric[k]):.3g}" '
                        f'style="border:1px solid #ccc;margin:1px;padding:1px 3px;display:inline-block">'
                        f"{html.escape(token)}</span>" for k, token in enumerate(self.token_strs))
        report.add_section("Generated text", "Each generated token in order; the strips below follow it.",
                           html=f"<p>{spans}</p>")
        for image in range(len(self.grids)):
            for method in (*ESTIMATES, *(["exact"] if "exact" in self.region_maps else [])):
                what = ("exact patching of each region" if method == "exact" else method.replace("_", " "))
                report.add_section(f"{what}, image {image}",
                                   f"One map per generated token: the change of its {self.metric} "
                                   f"({'measured' if method == 'exact' else 'estimated'}) when the image "
                                   f"{'region' if method == 'exact' else 'token'} is at the baseline "
                                   f"{'(gradient x activation: against zero)' if method == ESTIMATES[0] else ''}.",
                                   figure=self.plot(method, image))
        if self.lens_prob is not None:
            report.add_section("Logit lens", "Each generated token's probability read from each layer's output.",
                               figure=self.lens_figure())
        rows = [{"image": image, "estimate": method, "pearson (mean over tokens)": values["pearson_mean"],
                 "spearman (mean over tokens)": values["spearman_mean"], "pearson (all)": values["pearson_all"]}
                for image in range(len(self.grids)) for method, values in self.agreement(image).items()]
        if rows:
            report.add_section("Agreement with exact patching", "Correlation of each estimate with the exact "
                               "patching of the regions, across regions.", table=rows)
        return report

    def save(self, path: str | Path) -> Path:
        """results.json (and generation_attribution.html beside it when `path` is a folder)."""
        written = super().save(path)
        if Path(path).suffix != ".json":
            self.report().write(written.parent / HTML_FILE)
        return written

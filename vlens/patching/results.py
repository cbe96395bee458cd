"""`PatchingResult`: the tensors of a sweep (layer x cell x metric), pair ids, JSON and plots."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
from jaxtyping import Float
from torch import Tensor

from vlens.finite import json_safe
from vlens.patching.metrics import METRICS, Baseline
from vlens.viz.figures import layer_head_heatmap, layer_region_figure
from vlens.viz.optional import require_make_subplots, require_plotly

# mode -> name of the cell axis in JSON
CELL_AXIS = {"layer-region": "regions", "layer-pos": "positions", "layer-head": "heads"}


def _jsonable(values: Tensor) -> list:
    """Nested lists with NaN / inf -> None (JSON has no NaN)."""
    return json_safe(values.detach().cpu().double())


@dataclass
class PatchingResult:
    """One exact sweep.

    Attributes:
        mode: "layer-region", "layer-pos" or "layer-head".
        component: the patched activation ("resid_pre", "attn_out", "mlp_out" or "z").
        layers: patched layers (rows of every metric).
        cells: column labels: region names, positions, or heads ("H0", ...).
        metrics: name -> [n_layers, n_cells] for each of `METRICS`.
        per_pair_logit_diff: [n_layers, n_cells, n_pairs].
        per_pair_prediction: [n_layers, n_cells, n_pairs] the patched run's argmax token.
        pair_ids: the pairs, in row order.
        baseline: the unpatched clean / corrupt runs.
        region: for "layer-head", the positions patched ("all", "image", ...).
        tokens: for "layer-pos", the token string at each position (first pair).
        image_positions, image_grid: for "layer-pos", the image-token columns and their (rows, cols) grid.
    """

    mode: str
    component: str
    layers: list[int]
    cells: list
    metrics: dict[str, Float[Tensor, "n_layers n_cells"]]
    per_pair_logit_diff: Float[Tensor, "n_layers n_cells n_pairs"]
    per_pair_prediction: Tensor
    pair_ids: list[str]
    baseline: Baseline
    region: str | None = None
    tokens: list[str] | None = None
    image_positions: list[int] | None = None
    image_grid: tuple[int, int] | None = None
    extra: dict = field(default_factory=dict)

    @property
    def n_pairs(self) -> int:
        return len(self.pair_ids)

    def __getitem__(self, metric: str) -> Tensor:
        return self.metrics[metric]

    @property
    def tensor(self) -> Float[Tensor, "n_layers n_cells n_metrics"]:
        """All metrics stacked in `METRICS` order."""
        return torch.stack([self.metrics[name] for name in METRICS], dim=-1)

    def image_grid_values(self, metric: str = "overwrite_rate") -> Float[Tensor, "n_layers rows cols"]:
        """For "layer-pos": the metric at the image positions laid out on the image grid."""
        if self.mode != "layer-pos" or self.image_positions is None or self.image_grid is None:
            raise ValueError("image_grid_values needs a layer-pos result whose pairs share one image layout")
        columns = [self.cells.index(p) for p in self.image_positions]
        rows, cols = self.image_grid
        return self.metrics[metric][:, columns].reshape(len(self.layers), rows, cols)

    # ------------------------------------------------------------------ I/O
    def to_json(self) -> dict:
        """A JSON-ready dict: mode, n_pairs, layers, the cell axis, and per metric a [layer][cell] list."""
        out: dict = {"mode": self.mode, "component": self.component, "n_pairs": self.n_pairs,
                     "pair_ids": list(self.pair_ids), "layers": list(self.layers), CELL_AXIS[self.mode]: list(self.cells)}
        if self.region is not None:
            out["region"] = self.region
        if self.tokens is not None:
            out["tokens"] = list(self.tokens)
        if self.image_positions is not None:
            out["image_positions"] = list(self.image_positions)
            out["image_grid"] = list(self.image_grid) if self.image_grid else None
        for name in METRICS:
            out[name] = _jsonable(self.metrics[name])
        out["per_pair_logit_diff"] = _jsonable(self.per_pair_logit_diff)
        out["per_pair_prediction"] = self.per_pair_prediction.tolist()
        b = self.baseline
        out["baseline"] = {
            "clean_logit_diff": _jsonable(b.clean_logit_diff),
            "corrupt_logit_diff": _jsonable(b.corrupt_logit_diff),
            "finite": b.finite.tolist(),
            "clean_correct": b.clean_correct.tolist(),
            "corrupt_correct": b.corrupt_correct.tolist(),
            "clean_tokens": b.clean_tokens.tolist(),
            "corrupt_tokens": b.corrupt_tokens.tolist(),
        }
        out.update(self.extra)
        return out

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_json(), indent=1, allow_nan=False))
        return path

    # ------------------------------------------------------------------ plots
    def plot(self, metric: str = "overwrite_rate", kind: str | None = None):
        """layer-region: lines per region (or kind="heatmap"); layer-head: layer x head heatmap;
        layer-pos: layer x position heatmap (see `plot_image_grid` for the image positions)."""
        values = self.metrics[metric]
        title = f"{metric} — patching {self.component} ({self.mode}, {self.n_pairs} pairs)"
        if self.mode == "layer-region":
            return layer_region_figure(values, [str(c) for c in self.cells], title=title, value_label=metric,
                                       kind=kind or "lines", layer_labels=[str(x) for x in self.layers])
        if self.mode == "layer-head":
            return layer_head_heatmap(values, title=title, value_label=metric)

        go = require_plotly()
        labels = [f"{p}:{t}" for p, t in zip(self.cells, self.tokens or [""] * len(self.cells), strict=True)]
        figure = go.Figure(go.Heatmap(z=values.numpy(), x=labels, y=[f"L{x}" for x in self.layers],
                                      colorscale="RdBu_r", zmid=0.0, colorbar={"title": {"text": metric}}))
        figure.update_layout(title=title, xaxis_title="position:token", yaxis_title="layer")
        return figure

    def plot_image_grid(self, metric: str = "overwrite_rate"):
        """layer-pos: one image-grid heatmap per layer (row 0 at the top, as in the image)."""
        go, make_subplots = require_plotly(), require_make_subplots()
        grids = self.image_grid_values(metric)
        figure = make_subplots(rows=1, cols=len(self.layers), subplot_titles=[f"layer {x}" for x in self.layers])
        zmax = float(grids.abs().max()) or 1.0
        for i, grid in enumerate(grids):
            figure.add_trace(go.Heatmap(z=grid.numpy(), colorscale="RdBu_r", zmin=-zmax, zmax=zmax,
                                        showscale=i == 0, colorbar={"title": {"text": metric}}), row=1, col=i + 1)
            figure.update_yaxes(autorange="reversed", row=1, col=i + 1)
        figure.update_layout(title=f"{metric} of patching each image token ({self.component})")
        return figure


def stack_metrics(metrics: dict[str, Tensor], n_layers: int, n_cells: int) -> tuple[dict[str, Tensor], Tensor, Tensor]:
    """Reshape flat per-condition metrics ([n_layers * n_cells], layer-major) to [n_layers, n_cells].

    Returns (metrics, per-pair logit diff, per-pair prediction), the last two [n_layers, n_cells, n_pairs].
    """
    shaped = {name: metrics[name].reshape(n_layers, n_cells) for name in METRICS}
    per_pair = metrics["per_pair_logit_diff"].reshape(n_layers, n_cells, -1)
    return shaped, per_pair, metrics["per_pair_prediction"].reshape(n_layers, n_cells, -1)


__all__ = ["CELL_AXIS", "PatchingResult", "stack_metrics"]

"""`PatchingResult`: the tensors of a sweep (layer x cell x metric), pair ids, JSON and plots."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from jaxtyping import Float, Shaped
from torch import Tensor

from vlens.patching.metrics import METRICS, Baseline, EffectFloor, SavedBaseline
from vlens.utils.errors import UserInputError
from vlens.utils.finite import json_safe
from vlens.utils.results import Result, nan_tensor
from vlens.utils.stats import LEVEL, bootstrap_counts, percentile_interval, resampled_means, wilson_interval
from vlens.viz.figures import layer_head_heatmap, layer_region_figure
from vlens.viz.optional import require_make_subplots, require_plotly

# mode -> name of the cell axis in JSON
CELL_AXIS = {"layer-region": "regions", "layer-pos": "positions", "layer-head": "heads", "layer-expert": "experts"}
N_RESAMPLES = 1000  # bootstrap resamples of the pairs behind every cell's interval
ROLES = {"noising": {"base": "clean", "source": "corrupt"}, "denoising": {"base": "corrupt", "source": "clean"}}


def _number(value: float | None) -> float:
    """A saved float (JSON null: NaN)."""
    return float("nan") if value is None else float(value)


def _jsonable(values: Tensor) -> list:
    """Nested lists with NaN / inf -> None (JSON has no NaN)."""
    return json_safe(values.detach().cpu().double())


@dataclass
class PatchingResult(Result):
    """One exact sweep.

    Attributes:
        mode: "layer-region", "layer-pos", "layer-head" or "layer-expert" (`vlens.patching.experts`).
        component: the patched activation ("resid_pre", "attn_out", "mlp_out" or "z").
        layers: patched layers (rows of every metric).
        cells: column labels: region names, positions, or heads ("H0", ...).
        metrics: name -> [n_layers, n_cells]: each of `METRICS` for the default answer metrics,
            else each value the sweep's metric returned (averaged over pairs).
        per_pair: name -> [n_layers, n_cells, n_pairs]: the answer metrics' "logit_diff" and
            "prediction" (the patched run's argmax token), or a metric's per-pair values.
        pair_ids: the pairs, in row order.
        baseline: the unpatched clean / corrupt runs (answer metrics), else None.
        baseline_values: a user metric's values on the unpatched runs: name -> {"clean", "corrupt"}.
        metric: "answer" (the default metrics) or the metric's name; readout: where logits were read.
        region: for "layer-head", the positions patched ("all", "image", ...).
        tokens: for "layer-pos", the token string at each position (first pair).
        image_positions, image_grid: for "layer-pos", the image-token columns and their (rows, cols) grid.
        direction: "noising" (corrupt activations patched into the clean run) or "denoising" (clean
            into corrupt). The metrics and `baseline` are always of the run that receives the patch
            ("clean" in `Baseline`'s names) against the run the activation comes from: for denoising
            `baseline.clean_*` is the corrupt input's run (`ROLES`).
        effect_floor: the patch effect's denominator and noise floor (`vlens.patching.metrics.EffectFloor`).
        intervals: metric -> (low, high) [n_layers, n_cells]: 95% percentile bootstrap intervals over
            pairs (`bootstrap`), set by the sweeps.
    """

    mode: str
    component: str
    layers: list[int]
    cells: list[str] | list[int]
    metrics: dict[str, Float[Tensor, "n_layers n_cells"]]
    per_pair: dict[str, Shaped[Tensor, "n_layers n_cells n_pairs"]]
    pair_ids: list[str]
    baseline: Baseline | SavedBaseline | None
    baseline_values: dict[str, dict[str, Tensor]] | None = None
    metric: str = "answer"
    readout: str | list[int] = "final"
    region: str | None = None
    tokens: list[str] | None = None
    image_positions: list[int] | None = None
    image_grid: tuple[int, int] | None = None
    extra: dict = field(default_factory=dict)
    direction: str = "noising"
    effect_floor: EffectFloor | None = None
    intervals: dict[str, tuple[Tensor, Tensor]] | None = None

    kind: ClassVar[str] = "patching"
    # list lengths that must agree with the tensors' named sizes when a file is read (vlens.utils.saved_fields)
    saved_dims: ClassVar[dict[str, str]] = {"layers": "n_layers", "cells": "n_cells", "pair_ids": "n_pairs"}

    def saved_key(self, name: str) -> str:
        """The key of results.json that field `name` is saved under (the cells under their axis: "regions", ...)."""
        return CELL_AXIS.get(self.mode, name) if name == "cells" else name

    @property
    def n_pairs(self) -> int:
        return len(self.pair_ids)

    def cell_name(self, row: int, column: int) -> str:
        """A cell for messages: "L3H1" (layer-head), "layer 3 position 17", "layer 3 image"."""
        layer, cell = self.layers[row], self.cells[column]
        if self.mode in ("layer-head", "layer-expert"):
            return f"L{layer}{'H' if self.mode == 'layer-head' else 'E'}{cell}"
        return f"layer {layer} position {cell}" if self.mode == "layer-pos" else f"layer {layer} {cell}"

    def pair_values(self) -> dict[str, Tensor]:
        """What each metric averages over pairs: name -> [n_layers, n_cells, n_pairs], NaN where a pair
        is undefined (for the patch effect: the numerator LD_patched - LD_base of each pair)."""
        if self.baseline is None:
            return {name: value.double() for name, value in self.per_pair.items()}
        b = self.baseline
        prediction = self.per_pair["prediction"]
        ok = (prediction >= 0) & b.finite
        clean_correct = b.clean_correct
        clean_tokens, corrupt_tokens = b.clean_tokens.cpu(), b.corrupt_tokens.cpu()

        def share(hit: Tensor) -> Tensor:
            return torch.where(ok, hit.double(), torch.nan)

        diff = self.per_pair["logit_diff"].double()
        return {
            "overwrite_rate": share(clean_correct & (prediction == corrupt_tokens)),
            "flip_away_rate": share(clean_correct & (prediction != clean_tokens)),
            "corrupt_answer_rate": share(prediction == corrupt_tokens),
            "logit_diff": torch.where(ok, diff, torch.nan),
            "patch_effect": torch.where(ok, diff - b.clean_logit_diff.double(), torch.nan),
        }

    def bootstrap_draws(self, counts: Tensor) -> dict[str, Tensor]:
        """Every metric recomputed on each bootstrap resample of the pairs: name -> [n_resamples,
        n_layers, n_cells]. counts: [n_resamples, n_pairs] how often each pair is drawn
        (`vlens.utils.stats.bootstrap_counts`). Rates and the logit difference are means over the
        resample; the patch effect the ratio of means mean(LD_patched - LD_base) / mean(LD_source -
        LD_base), NaN where that denominator is within the full sample's noise floor."""
        out = {}
        for name, values in self.pair_values().items():
            if name not in self.metrics:
                continue
            draws = resampled_means(values.movedim(-1, 0), counts)  # [n_resamples, n_layers, n_cells]
            if name == "patch_effect" and self.baseline is not None:
                b = self.baseline
                difference = (b.corrupt_logit_diff.double() - b.clean_logit_diff.double()).cpu()
                defined = values.isfinite()
                denominators = resampled_means(torch.where(defined, difference, torch.nan).movedim(-1, 0), counts)
                floor = self.effect_floor.floor if self.effect_floor is not None else 0.0
                draws = torch.where(denominators.abs() > floor, draws / denominators, torch.nan)
            out[name] = draws
        return out

    def bootstrap(self, n_resamples: int = N_RESAMPLES, seed: int = 0,
                  level: float = LEVEL) -> dict[str, tuple[Tensor, Tensor]]:
        """Percentile bootstrap intervals over pairs of every metric in every cell (`bootstrap_draws`,
        resampled with replacement, seeded). A cell whose metric is NaN gets a NaN interval."""
        out = {}
        for name, draws in self.bootstrap_draws(bootstrap_counts(self.n_pairs, n_resamples, seed)).items():
            low, high = percentile_interval(draws, level)
            missing = self.metrics[name].isnan()
            out[name] = (low.masked_fill(missing, torch.nan), high.masked_fill(missing, torch.nan))
        return out

    @property
    def per_pair_logit_diff(self) -> Float[Tensor, "n_layers n_cells n_pairs"]:
        """The answer metrics' per-pair logit difference (corrupt minus clean answer)."""
        return self.per_pair["logit_diff"]

    @property
    def per_pair_prediction(self) -> Tensor:
        """The answer metrics' per-pair argmax token of the patched run (-1 where not finite)."""
        return self.per_pair["prediction"]

    def __getitem__(self, metric: str) -> Tensor:
        return self.metrics[metric]

    @property
    def metric_names(self) -> list[str]:
        return [name for name in METRICS if name in self.metrics] or list(self.metrics)

    @property
    def tensor(self) -> Float[Tensor, "n_layers n_cells n_metrics"]:
        """All metrics stacked in `metric_names` order (`METRICS` for the answer metrics)."""
        return torch.stack([self.metrics[name] for name in self.metric_names], dim=-1)

    def image_grid_values(self, metric: str | None = None) -> Float[Tensor, "n_layers rows cols"]:
        """For "layer-pos": the metric at the image positions laid out on the image grid."""
        if self.mode != "layer-pos" or self.image_positions is None or self.image_grid is None:
            raise UserInputError("image_grid_values needs a layer-pos result whose pairs share one image layout")
        cells: list[Any] = list(self.cells)  # (positions: integers)
        columns = [cells.index(p) for p in self.image_positions]
        rows, cols = self.image_grid
        return self.metrics[metric or self.metric_names[0]][:, columns].reshape(len(self.layers), rows, cols)

    # ------------------------------------------------------------------ I/O
    def to_dict(self) -> dict:
        """A JSON-ready dict: mode, n_pairs, layers, the cell axis, and per metric a [layer][cell] list."""
        out: dict = {"mode": self.mode, "component": self.component, "direction": self.direction,
                     "roles": ROLES[self.direction], "n_pairs": self.n_pairs,
                     "pair_ids": list(self.pair_ids), "layers": list(self.layers), CELL_AXIS[self.mode]: list(self.cells),
                     "metric": self.metric, "readout": self.readout}
        if self.region is not None:
            out["region"] = self.region
        if self.tokens is not None:
            out["tokens"] = list(self.tokens)
        if self.image_positions is not None:
            out["image_positions"] = list(self.image_positions)
            out["image_grid"] = list(self.image_grid) if self.image_grid else None
        for name in self.metric_names:
            out[name] = _jsonable(self.metrics[name])
        for name, values in self.per_pair.items():
            out[f"per_pair_{name}"] = values.tolist() if name == "prediction" else _jsonable(values)
        b = self.baseline
        if b is not None:
            out["baseline"] = {
                "clean_logit_diff": _jsonable(b.clean_logit_diff),
                "corrupt_logit_diff": _jsonable(b.corrupt_logit_diff),
                "finite": b.finite.tolist(),
                "clean_correct": b.clean_correct.tolist(),
                "corrupt_correct": b.corrupt_correct.tolist(),
                "clean_tokens": b.clean_tokens.tolist(),
                "corrupt_tokens": b.corrupt_tokens.tolist(),
            }
        if self.baseline_values is not None:
            out["baseline"] = {name: {role: _jsonable(v) for role, v in roles.items()}
                               for name, roles in self.baseline_values.items()}
        if self.effect_floor is not None:
            out["patch_effect_floor"] = json_safe(self.effect_floor.to_dict())
        if self.intervals:
            out["intervals"] = {"level": LEVEL, "method": f"percentile bootstrap over pairs ({N_RESAMPLES} resamples, "
                                "seed 0)", **{name: {"low": _jsonable(low), "high": _jsonable(high)}
                                              for name, (low, high) in self.intervals.items()}}
        out.update(self.extra)
        return out

    @classmethod
    def from_dict(cls, data: dict) -> PatchingResult:
        """The result `to_dict` wrote (a loaded answer-metric baseline is a `SavedBaseline`: the
        per-pair values without the logits)."""
        mode = data["mode"]
        prefix = "per_pair_"
        per_pair_names = [key[len(prefix):] for key in data if key.startswith(prefix)]
        metric = data.get("metric", "answer")
        if metric == "answer":
            names = [name for name in METRICS if name in data]
        else:
            names = [name for name in per_pair_names if name in data]
        per_pair = {name: torch.tensor(data[prefix + name]) if name == "prediction"
                    else nan_tensor(data[prefix + name], torch.float64) for name in per_pair_names}
        baseline: SavedBaseline | None = None
        baseline_values = None
        saved = data.get("baseline")
        if saved is not None and metric == "answer":
            baseline = SavedBaseline(
                clean_logit_diff=nan_tensor(saved["clean_logit_diff"], torch.float64),
                corrupt_logit_diff=nan_tensor(saved["corrupt_logit_diff"], torch.float64),
                finite=torch.tensor(saved["finite"], dtype=torch.bool),
                clean_correct=torch.tensor(saved["clean_correct"], dtype=torch.bool),
                corrupt_correct=torch.tensor(saved["corrupt_correct"], dtype=torch.bool),
                clean_tokens=torch.tensor(saved["clean_tokens"], dtype=torch.long),
                corrupt_tokens=torch.tensor(saved["corrupt_tokens"], dtype=torch.long))
        elif saved is not None:
            baseline_values = {name: {role: nan_tensor(v, torch.float64) for role, v in roles.items()}
                               for name, roles in saved.items()}
        floor = data.get("patch_effect_floor")
        effect_floor = None if floor is None else EffectFloor(
            denominator=_number(floor["denominator"]), standard_error=_number(floor["standard_error"]),
            resolution=_number(floor["resolution"]), dtype=floor["dtype"], n_pairs=int(floor["n_pairs"]))
        intervals = None
        if data.get("intervals"):
            intervals = {name: (nan_tensor(v["low"], torch.float64), nan_tensor(v["high"], torch.float64))
                         for name, v in data["intervals"].items() if name not in ("level", "method")}
        grid = data.get("image_grid")
        return cls(mode=mode, component=data["component"], layers=list(data["layers"]),
                   cells=list(data[CELL_AXIS[mode]]),
                   metrics={name: nan_tensor(data[name], torch.float64) for name in names},
                   per_pair=per_pair, pair_ids=list(data["pair_ids"]), baseline=baseline,
                   baseline_values=baseline_values, metric=metric, readout=data.get("readout", "final"),
                   region=data.get("region"), tokens=data.get("tokens"), image_positions=data.get("image_positions"),
                   image_grid=None if grid is None else (int(grid[0]), int(grid[1])),
                   direction=data.get("direction", "noising"), effect_floor=effect_floor, intervals=intervals)

    # ------------------------------------------------------------------ plots
    def rate_interval(self, metric: str, level: float = 0.95) -> tuple[Tensor, Tensor]:
        """Wilson interval of a rate metric ("overwrite_rate", "flip_away_rate": shares of the pairs)."""
        if not metric.endswith("_rate"):
            raise UserInputError(f"{metric!r} is not a share of pairs; intervals are for the *_rate metrics")
        values = self.metrics[metric].double()
        successes = (values.nan_to_num(0.0) * self.n_pairs).round().clamp(0, self.n_pairs)
        return wilson_interval(successes, torch.full_like(values, float(self.n_pairs)), level)

    def plot(self, metric: str | None = None, kind: str | None = None):
        """layer-region: lines per region (or kind="heatmap"; rates carry 95% Wilson intervals over
        pairs); layer-head: layer x head heatmap; layer-pos: layer x position heatmap (see
        `plot_image_grid` for the image positions).
        metric: default the first one ("overwrite_rate" for the answer metrics)."""
        metric = metric or self.metric_names[0]
        values = self.metrics[metric]
        title = f"{metric} — patching {self.component} ({self.mode}, {self.n_pairs} pairs)"
        if self.mode == "layer-region":
            low, high = self.rate_interval(metric) if metric.endswith("_rate") else (None, None)
            if low is not None:
                title += ", 95% intervals"
            return layer_region_figure(values, [str(c) for c in self.cells], title=title, value_label=metric,
                                       kind=kind or "lines", layer_labels=[str(x) for x in self.layers],
                                       lower=low, upper=high)
        if self.mode in ("layer-head", "layer-expert"):
            return layer_head_heatmap(values, title=title, value_label=metric,
                                      unit="head" if self.mode == "layer-head" else "expert")

        go = require_plotly()
        labels = [f"{p}:{t}" for p, t in zip(self.cells, self.tokens or [""] * len(self.cells), strict=True)]
        figure = go.Figure(go.Heatmap(z=values.numpy(), x=labels, y=[f"L{x}" for x in self.layers],
                                      colorscale="RdBu_r", zmid=0.0, colorbar={"title": {"text": metric}}))
        figure.update_layout(title=title, xaxis_title="position:token", yaxis_title="layer")
        return figure

    def plot_image_grid(self, metric: str | None = None):
        """layer-pos: one image-grid heatmap per layer (row 0 at the top, as in the image)."""
        metric = metric or self.metric_names[0]
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


def stack_metrics(values: dict[str, Tensor], n_layers: int, n_cells: int) -> dict[str, Tensor]:
    """Reshape flat per-condition values ([n_layers * n_cells, ...], layer-major) to [n_layers, n_cells, ...]."""
    return {name: value.reshape(n_layers, n_cells, *value.shape[1:]) for name, value in values.items()}


__all__ = ["CELL_AXIS", "PatchingResult", "stack_metrics"]

"""Exact visual activation patching sweeps over a batch of controlled pairs.

    batch = build_pair_batch(model, make_count_pairs(16))
    result = patch_layer_region(model, batch, component="resid_pre")   # [layer x region] metrics
    result = patch_layer_position(model, batch)                        # every position; image grid too
    result = patch_layer_head(model, batch, region="all")              # one head's hook_z at a time

Every cell patches the corrupt run's activation into the clean run (`direction="noising"`, the
default; see `runner`), or the clean run's into the corrupt one (`direction="denoising"`, what
TransformerLens's `get_act_patch_*` do); method "fast" (default) and "naive" give equal numbers,
"naive" being the one-forward-per-cell loop. Every cell of the answer metrics carries a 95%
percentile bootstrap interval over pairs (`result.intervals`), and the normalised patch effect
is NaN where the clean and corrupt runs differ by less than the noise floor
(`vlens.patching.metrics.effect_floor`), with a `NoiseFloorWarning` naming the cells.
Common arguments: `metric` (default: the answer metrics of `vlens.patching.metrics`; or any
callable, TransformerLens style: ``metric(logits [n_pairs, n_readout, d_vocab]) -> [n_pairs]``,
a number, or a dict of those), `direction`, and `options` (`vlens.SweepOptions`: `readout`, where
the logits are read, "final" or column indices of the left-padded batch, -1 being the final one;
`implementation`, "fast" or "naive"; `max_batch`, rows per forward in the fast path; `batch_size`,
run the pairs in chunks of this many, for memory; `progress`; `sharding`, split the forwards
across processes, every process gets the result; `cache_device`, where the corrupt activations
and clean residuals are kept).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from vlens.parallel.options import Readout, SweepOptions, fold_legacy
from vlens.patching.conditions import PatchSpec, check_component
from vlens.patching.metrics import (
    AnswerMetrics,
    MetricFn,
    MetricFunction,
    NoiseFloorWarning,
    Summary,
    as_metric,
    effect_floor,
)
from vlens.patching.pairs import PairBatch
from vlens.patching.results import PatchingResult, stack_metrics
from vlens.patching.sharded import run_specs_reduced
from vlens.utils.errors import UserInputError
from vlens.utils.finite import finite_rows, warn_non_finite

if TYPE_CHECKING:
    from vlens.core.model import HookedVLM

REGIONS: tuple[str, ...] = ("image", "text", "final", "all")
DIRECTIONS: tuple[str, ...] = ("noising", "denoising")  # corrupt into clean (default) | clean into corrupt
# the run keywords the sweeps took before `SweepOptions` (still accepted, with a DeprecationWarning)
SWEEP_LEGACY = ("method", "max_batch", "progress", "pair_batch_size", "sharding", "readout")


def oriented(batch: PairBatch, direction: str) -> PairBatch:
    """The batch whose "clean" run receives the patch: as is for noising, roles swapped for denoising."""
    if direction not in DIRECTIONS:
        raise UserInputError(f"direction must be one of {DIRECTIONS} (noising: corrupt activations into the clean "
                             f"run; denoising: clean into the corrupt run), got {direction!r}")
    return batch if direction == "noising" else batch.swapped()


def warn_noise_floor(result: PatchingResult) -> None:
    """A `NoiseFloorWarning` naming the cells whose patch effect the noise floor left undefined."""
    effect, diff = result.metrics.get("patch_effect"), result.metrics.get("logit_diff")
    if effect is None or diff is None or result.effect_floor is None:
        return
    undefined = (effect.isnan() & diff.isfinite()).nonzero().tolist()
    if not undefined:
        return
    cells = ", ".join(result.cell_name(a, b) for a, b in undefined[:6])
    more = f" (+{len(undefined) - 6} more)" if len(undefined) > 6 else ""
    every = " (every cell)" if len(undefined) == effect.numel() else ""
    warnings.warn(f"patching: the normalised patch effect is NaN at {len(undefined)} cells{every}: {cells}{more}: "
                  f"the {result.effect_floor.describe()}; the logit difference and the rates are still reported. "
                  "Use more pairs, a higher-precision dtype, or pairs whose answers the model tells apart.",
                  NoiseFloorWarning, stacklevel=3)


def _layers(model: HookedVLM, layers: Sequence[int] | None) -> list[int]:
    n = model.cfg.n_layers
    chosen = list(range(n)) if layers is None else [int(x) for x in layers]
    bad = [x for x in chosen if not 0 <= x < n]
    if bad or not chosen:
        raise UserInputError(f"layers {bad or chosen} are not valid: the model has layers 0..{n - 1}")
    return chosen


def report_non_finite(model: HookedVLM, batch: PairBatch, baseline, per_pair: torch.Tensor, layers: list[int], cells: list,
                      component: str) -> None:
    """Warn (`NonFiniteWarning`) about pairs whose unpatched runs, or cells whose patched runs, gave
    non-finite logits; their metrics are NaN already."""
    if not bool(baseline.finite.all()):
        bad = (~baseline.finite).nonzero().flatten().tolist()
        clean_bad = not bool(finite_rows(baseline.clean_logits).all())
        inputs = batch.clean if clean_bad else batch.corrupt
        warn_non_finite("patching", f"the unpatched {'clean' if clean_bad else 'corrupt'} run of pairs "
                        f"{[batch.pair_ids[i] for i in bad[:6]]}", model, inputs)
        return
    broken = per_pair.isnan().any(-1).nonzero().tolist()  # [(layer index, cell index)]
    if broken:
        where = ", ".join(f"layer {layers[a]} {cells[b]}" for a, b in broken[:6])
        warn_non_finite("patching", f"patched {component} at {where}" + (f" (+{len(broken) - 6} more)"
                                                                         if len(broken) > 6 else ""))


def _fill_missing(values: dict[str, torch.Tensor], present: torch.Tensor | None) -> dict[str, torch.Tensor]:
    """Per-condition values of the conditions that exist ([n_present, ...]) spread over every cell of the
    grid (`present`: bool [n_cells]), NaN (-1 for integer values) where a cell has no condition: a
    layer with fewer heads than the widest one (a hybrid decoder's linear-attention layers)."""
    if present is None:
        return values
    out = {}
    for name, value in values.items():
        fill = -1 if not value.is_floating_point() else float("nan")
        full = torch.full((len(present), *value.shape[1:]), fill, dtype=value.dtype)
        full[present] = value
        out[name] = full
    return out


def _result(model: HookedVLM, batch: PairBatch, specs: list[PatchSpec], axes: dict, metric: MetricFn | None,
            direction: str, options: SweepOptions, present: torch.Tensor | None = None) -> PatchingResult:
    """axes: mode, component, layers, cells and the mode's own fields; present: bool [n_layers * n_cells]
    (layer-major), which cells `specs` hold (None: all of them)."""
    readout = options.readout
    if metric is None and readout != "final":
        raise UserInputError("the default answer metrics read the final position: pass metric=... to read "
                             f"readout={readout!r}")
    given = batch
    batch = oriented(batch, direction)
    scorer = as_metric(metric, batch, getattr(model.cfg, "dtype", None))
    summary = run_specs_reduced(model, batch, specs, metric=scorer, options=options)
    return result_from_summary(model, given, batch, summary, scorer, {**axes, "readout": readout}, direction, present)


def result_from_summary(model: HookedVLM, given: PairBatch, batch: PairBatch, summary: Summary,
                        scorer: AnswerMetrics | MetricFunction, axes: dict, direction: str = "noising",
                        present: torch.Tensor | None = None) -> PatchingResult:
    """A `PatchingResult` from a sweep's metric `summary` (one condition per present cell, layer-major):
    the grids, non-finite warnings, the noise floor and the bootstrap intervals.

    given: the pairs as the caller gave them; batch: as run (`oriented` for the direction).
    axes: "mode", "component", "layers", "cells", "readout" and the mode's own fields (region, tokens, ...)."""
    axes = dict(axes)
    mode, component, layers, cells = axes.pop("mode"), axes.pop("component"), axes.pop("layers"), axes.pop("cells")
    readout: Readout = axes.pop("readout")
    metrics = stack_metrics(_fill_missing(summary.metrics, present), len(layers), len(cells))
    per_pair = stack_metrics(_fill_missing(summary.per_pair, present), len(layers), len(cells))
    if summary.baseline is not None:
        measured = per_pair["logit_diff"] if present is None else \
            per_pair["logit_diff"].masked_fill(~present.view(len(layers), len(cells), 1), 0.0)
        report_non_finite(model, batch, summary.baseline, measured, layers, cells, component)
    else:
        broken = sorted(name for name, value in metrics.items() if bool(value.isnan().any()))
        if broken:
            warn_non_finite("patching", f"metric values {broken} of patched {component}")
    result = PatchingResult(mode=mode, component=component, layers=layers, cells=cells, metrics=metrics,
                            per_pair=per_pair, pair_ids=list(batch.pair_ids), baseline=summary.baseline,
                            baseline_values=summary.baseline_values,
                            metric="answer" if isinstance(scorer, AnswerMetrics) else scorer.name,
                            readout=readout if isinstance(readout, str) else [int(c) for c in ([readout] if isinstance(
                                readout, int) else readout)],
                            direction=direction, extra={"answers": given.answers_json()}, **axes)
    if summary.baseline is not None:
        result.effect_floor = effect_floor(summary.baseline)
        warn_noise_floor(result)
    result.intervals = result.bootstrap()
    return result


def patch_layer_region(model: HookedVLM, batch: PairBatch, component: str = "resid_pre",
                       regions: Sequence[str] = REGIONS, layers: Sequence[int] | None = None,
                       metric: MetricFn | None = None, direction: str = "noising",
                       options: SweepOptions | None = None, **legacy: Any) -> PatchingResult:
    """Patch `component` ("resid_pre", "attn_out", "mlp_out") of each layer at each region.

    Args:
        model: the model.
        batch: the pairs (`build_pair_batch`).
        component: the activation patched at each layer.
        regions: the positions patched, some of `REGIONS` ("image", "text", "final", "all").
        layers: the layers patched (default all).
        metric: default the answer metrics; or ``metric(logits [n_pairs, n_readout, d_vocab])``.
        direction: "noising" (corrupt activations into the clean run, default) or "denoising".
        options: readout positions, fast / naive implementation, batch sizes, progress, sharding,
            cache device (`vlens.SweepOptions`).
    Returns:
        a `PatchingResult` with metrics [n_layers, n_regions].
    """
    options = fold_legacy(options, legacy, "patch_layer_region", SWEEP_LEGACY)
    check_component(component)
    for region in regions:
        if region not in REGIONS:
            raise UserInputError(f"unknown region {region!r}: use some of {REGIONS}")
    layers = _layers(model, layers)
    masks = {r: batch.region_mask(r) for r in regions}
    specs = [PatchSpec(layer, component, masks[r]) for layer in layers for r in regions]
    axes = {"mode": "layer-region", "component": component, "layers": layers, "cells": list(regions)}
    return _result(model, batch, specs, axes, metric, direction, options)


def patch_layer_frame(model: HookedVLM, batch: PairBatch, component: str = "resid_pre",
                      layers: Sequence[int] | None = None, metric: MetricFn | None = None,
                      direction: str = "noising", options: SweepOptions | None = None) -> PatchingResult:
    """Patch `component` of each layer at each frame of the pairs' videos (one video per pair, the same
    number of frames / temporal patches in every pair: `vlens.data.make_video_pair`).

    Returns:
        a "layer-region" `PatchingResult` whose cells are the frames "f0", "f1", ... (regions.frames):
        metrics [n_layers, n_frames].
    """
    check_component(component)
    frames = batch.clean.token_regions.frames
    if not frames or any(len(row) != 1 for row in frames) or len({len(row[0]) for row in frames}) != 1:
        raise UserInputError("patch_layer_frame needs pairs of one video each with the same number of frames "
                             "(build them from vlens.data.make_video_pair / make_video_count_pairs)")
    n_frames = len(frames[0][0])
    masks = []
    for k in range(n_frames):
        mask = torch.zeros(batch.n_pairs, batch.seq_len, dtype=torch.bool)
        for row in range(batch.n_pairs):
            mask[row, frames[row][0][k].cpu()] = True
        masks.append(mask)
    layers = _layers(model, layers)
    specs = [PatchSpec(layer, component, masks[k]) for layer in layers for k in range(n_frames)]
    axes = {"mode": "layer-region", "component": component, "layers": layers, "cells": [f"f{k}" for k in range(n_frames)]}
    return _result(model, batch, specs, axes, metric, direction, options or SweepOptions())


def patch_layer_region_components(model: HookedVLM, batch: PairBatch,
                                  components: Sequence[str] = ("resid_pre", "attn_out", "mlp_out"),
                                  **kwargs: Any) -> dict[str, PatchingResult]:
    """`patch_layer_region` for several components: {component: result} (kwargs: its arguments)."""
    return {component: patch_layer_region(model, batch, component=component, **kwargs) for component in components}


def patch_layer_position(model: HookedVLM, batch: PairBatch, component: str = "resid_pre",
                         layers: Sequence[int] | None = None, metric: MetricFn | None = None,
                         direction: str = "noising", options: SweepOptions | None = None,
                         **legacy: Any) -> PatchingResult:
    """Patch `component` of each layer at each position (a column of the left-padded batch).

    Rows are left-padded, so column p is the same slot counted from the final token in every
    pair; columns where a pair has padding patch nothing for that pair. When every pair has its
    image at the same columns, the result also maps those columns onto the image grid
    (`result.image_grid_values()`, `result.plot_image_grid()`).

    Args: as `patch_layer_region` (without regions).
    Returns:
        a `PatchingResult` with metrics [n_layers, seq_len].
    """
    options = fold_legacy(options, legacy, "patch_layer_position", SWEEP_LEGACY)
    check_component(component)
    layers = _layers(model, layers)
    seq_len = batch.seq_len
    valid = batch.clean.attention_mask.bool().cpu()
    positions = list(range(seq_len))
    specs = []
    for layer in layers:
        for p in positions:
            mask = torch.zeros_like(valid)
            mask[:, p] = valid[:, p]
            specs.append(PatchSpec(layer, component, mask))
    regions = batch.clean.token_regions
    longest = int(valid.sum(-1).argmax())  # a row without padding labels the columns
    tokens = batch.clean.input_ids[longest].tolist()
    token_strings = [str(t) for t in (model.to_str_tokens(tokens) if model.processor is not None else tokens)]
    image_positions, grid = None, None
    first = regions.image[0].tolist()
    rows = range(batch.n_pairs)
    if first and len(regions.image_grid[0]) == 1 and all(regions.image[r].tolist() == first for r in rows) \
            and all(regions.image_grid[r] == regions.image_grid[0] for r in rows):
        # the grid that covers the whole image: no CLS token; an anyres image's base view
        view = regions.image_view(0, 0)
        image_positions, grid = view.positions.tolist(), tuple(view.grid)
    axes = {"mode": "layer-pos", "component": component, "layers": layers, "cells": positions,
            "tokens": token_strings, "image_positions": image_positions, "image_grid": grid}
    return _result(model, batch, specs, axes, metric, direction, options)


def patch_layer_head(model: HookedVLM, batch: PairBatch, region: str = "all", layers: Sequence[int] | None = None,
                     heads: Sequence[int] | None = None, metric: MetricFn | None = None, direction: str = "noising",
                     options: SweepOptions | None = None, **legacy: Any) -> PatchingResult:
    """Patch one head's `hook_z` at a time (at `region`'s positions: "all", "image", "text", "final").

    In a hybrid decoder (Qwen3.5) the heads of a linear-attention layer are its value heads (their
    `hook_z`, before out_proj), and a layer with fewer heads than the widest layer has NaN in the
    cells it lacks.

    Args: as `patch_layer_region`, with `region` (one of `REGIONS`) and `heads` (default all).
    Returns:
        a `PatchingResult` with metrics [n_layers, n_heads].
    """
    options = fold_legacy(options, legacy, "patch_layer_head", SWEEP_LEGACY)
    if region not in REGIONS:
        raise UserInputError(f"unknown region {region!r}: use one of {REGIONS}")
    layers = _layers(model, layers)
    cfg = model.cfg
    n_heads = cfg.max_heads
    heads = list(range(n_heads)) if heads is None else [int(h) for h in heads]
    if any(not 0 <= h < n_heads for h in heads):
        raise UserInputError(f"heads {heads} are not valid: the model has heads 0..{n_heads - 1}")
    mask = batch.region_mask(region)
    present = torch.tensor([h < cfg.heads_at(layer) for layer in layers for h in heads], dtype=torch.bool)
    specs = [PatchSpec(layer, "z", mask, head=h) for layer in layers for h in heads if h < cfg.heads_at(layer)]
    axes = {"mode": "layer-head", "component": "z", "layers": layers, "cells": heads, "region": region}
    return _result(model, batch, specs, axes, metric, direction, options,
                   present=None if bool(present.all()) else present)

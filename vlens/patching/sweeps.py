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
Common keywords: `metric` (default: the answer metrics of `vlens.patching.metrics`; or any
callable, TransformerLens style: ``metric(logits [n_pairs, n_readout, d_vocab]) -> [n_pairs]``,
a number, or a dict of those), `readout` (where the logits are read: "final", or column
indices of the left-padded batch, -1 being the final one), `max_batch` (rows per forward in
the fast path), `pair_batch_size` (run the pairs in chunks of this many, for memory),
`progress` (tqdm bars), `sharding` (a `vlens.parallel.Sharding`: split the forwards across
processes; every process gets the result).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from vlens.patching.conditions import PatchSpec, check_component
from vlens.patching.metrics import AnswerMetrics, MetricFn, NoiseFloorWarning, as_metric, effect_floor
from vlens.patching.pairs import PairBatch, Readout
from vlens.patching.results import PatchingResult, stack_metrics
from vlens.patching.sharded import run_specs_reduced
from vlens.utils.errors import UserInputError
from vlens.utils.finite import finite_rows, warn_non_finite

if TYPE_CHECKING:
    from vlens.core.model import HookedVLM
    from vlens.parallel import Sharding

REGIONS: tuple[str, ...] = ("image", "text", "final", "all")
DIRECTIONS: tuple[str, ...] = ("noising", "denoising")  # corrupt into clean (default) | clean into corrupt


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
        raise ValueError(f"layers {bad or chosen} are not valid: the model has layers 0..{n - 1}")
    return chosen


def report_non_finite(model, batch: PairBatch, baseline, per_pair: torch.Tensor, layers: list[int], cells: list,
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


def _result(model, batch, specs, mode, component, layers, cells, method, max_batch, progress, pair_batch_size,
            sharding, metric, readout, direction="noising", present: torch.Tensor | None = None,
            **extra) -> PatchingResult:
    """present: bool [n_layers * n_cells] (layer-major), which cells `specs` hold (None: all of them)."""
    if metric is None and readout != "final":
        raise UserInputError("the default answer metrics read the final position: pass metric=... to read "
                             f"readout={readout!r}")
    given = batch
    batch = oriented(batch, direction)
    scorer = as_metric(metric, batch, getattr(model.cfg, "dtype", None))
    summary = run_specs_reduced(model, batch, specs, method=method, max_batch=max_batch, progress=progress,
                                pair_batch_size=pair_batch_size, sharding=sharding, metric=scorer, readout=readout)
    return result_from_summary(model, given, batch, summary, scorer, mode, component, layers, cells, readout,
                               direction, present, **extra)


def result_from_summary(model, given: PairBatch, batch: PairBatch, summary, scorer, mode: str, component: str,
                        layers: list[int], cells: list, readout: Readout, direction: str = "noising",
                        present: torch.Tensor | None = None, **extra) -> PatchingResult:
    """A `PatchingResult` from a sweep's metric `summary` (one condition per present cell, layer-major):
    the grids, non-finite warnings, the noise floor and the bootstrap intervals.

    given: the pairs as the caller gave them; batch: as run (`oriented` for the direction)."""
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
                            direction=direction, extra={"answers": given.answers_json()}, **extra)
    if summary.baseline is not None:
        result.effect_floor = effect_floor(summary.baseline)
        warn_noise_floor(result)
    result.intervals = result.bootstrap()
    return result


def patch_layer_region(model: HookedVLM, batch: PairBatch, component: str = "resid_pre",
                       regions: Sequence[str] = REGIONS, layers: Sequence[int] | None = None,
                       method: str = "fast", max_batch: int = 64, progress: bool = False,
                       pair_batch_size: int | None = None, sharding: Sharding | None = None,
                       metric: MetricFn | None = None, readout: Readout = "final",
                       direction: str = "noising") -> PatchingResult:
    """Patch `component` ("resid_pre", "attn_out", "mlp_out") of each layer at each region.

    direction: "noising" (corrupt activations into the clean run, default) or "denoising".
    Returns a PatchingResult with metrics [n_layers, n_regions].
    """
    check_component(component)
    for region in regions:
        if region not in REGIONS:
            raise ValueError(f"unknown region {region!r}: use some of {REGIONS}")
    layers = _layers(model, layers)
    masks = {r: batch.region_mask(r) for r in regions}
    specs = [PatchSpec(layer, component, masks[r]) for layer in layers for r in regions]
    return _result(model, batch, specs, "layer-region", component, layers, list(regions), method, max_batch, progress,
                   pair_batch_size, sharding, metric, readout, direction)


def patch_layer_region_components(model: HookedVLM, batch: PairBatch,
                                  components: Sequence[str] = ("resid_pre", "attn_out", "mlp_out"),
                                  **kwargs) -> dict[str, PatchingResult]:
    """`patch_layer_region` for several components: {component: result}."""
    return {component: patch_layer_region(model, batch, component=component, **kwargs) for component in components}


def patch_layer_position(model: HookedVLM, batch: PairBatch, component: str = "resid_pre",
                         layers: Sequence[int] | None = None, method: str = "fast", max_batch: int = 64,
                         progress: bool = False, pair_batch_size: int | None = None,
                         sharding: Sharding | None = None, metric: MetricFn | None = None,
                         readout: Readout = "final", direction: str = "noising") -> PatchingResult:
    """Patch `component` of each layer at each position (a column of the left-padded batch).

    direction: "noising" (corrupt activations into the clean run, default) or "denoising".

    Rows are left-padded, so column p is the same slot counted from the final token in every
    pair; columns where a pair has padding patch nothing for that pair. When every pair has its
    image at the same columns, the result also maps those columns onto the image grid
    (`result.image_grid_values()`, `result.plot_image_grid()`).
    """
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
    return _result(model, batch, specs, "layer-pos", component, layers, positions, method, max_batch, progress,
                   pair_batch_size, sharding, metric, readout, direction, tokens=token_strings,
                   image_positions=image_positions, image_grid=grid)


def patch_layer_head(model: HookedVLM, batch: PairBatch, region: str = "all", layers: Sequence[int] | None = None,
                     heads: Sequence[int] | None = None, method: str = "fast", max_batch: int = 64,
                     progress: bool = False, pair_batch_size: int | None = None,
                     sharding: Sharding | None = None, metric: MetricFn | None = None,
                     readout: Readout = "final", direction: str = "noising") -> PatchingResult:
    """Patch one head's `hook_z` at a time (at `region`'s positions: "all", "image", "text", "final").

    direction: "noising" (corrupt activations into the clean run, default) or "denoising".

    Returns a PatchingResult with metrics [n_layers, n_heads]. In a hybrid decoder (Qwen3.5) the
    heads of a linear-attention layer are its value heads (their `hook_z`, before out_proj), and a
    layer with fewer heads than the widest layer has NaN in the cells it lacks.
    """
    if region not in REGIONS:
        raise ValueError(f"unknown region {region!r}: use one of {REGIONS}")
    layers = _layers(model, layers)
    cfg = model.cfg
    n_heads = cfg.max_heads
    heads = list(range(n_heads)) if heads is None else [int(h) for h in heads]
    if any(not 0 <= h < n_heads for h in heads):
        raise ValueError(f"heads {heads} are not valid: the model has heads 0..{n_heads - 1}")
    mask = batch.region_mask(region)
    present = torch.tensor([h < cfg.heads_at(layer) for layer in layers for h in heads], dtype=torch.bool)
    specs = [PatchSpec(layer, "z", mask, head=h) for layer in layers for h in heads if h < cfg.heads_at(layer)]
    return _result(model, batch, specs, "layer-head", "z", layers, heads, method, max_batch,
                   progress, pair_batch_size, sharding, metric, readout, direction,
                   present=None if bool(present.all()) else present, region=region)

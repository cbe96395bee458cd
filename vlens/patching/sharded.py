"""Patch sweeps as independent work units, run by `Sharding.map` on one process or many.

A unit is one forward of the single-process sweep: (pair chunk, chunk of conditions) for the
fast path, (pair chunk, condition) for the naive one. Each process builds the plan of a pair
chunk (the clean and corrupt runs) when it first needs it and runs its share of the chunks.
A unit returns what the metric keeps of its patched logits, per condition and pair (for the
default answer metrics: the logit difference and the argmax token), so results stay small
however large the vocabulary is; the first unit of each pair chunk also returns the unpatched
logits (the baseline).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from vlens.parallel.options import SweepOptions
from vlens.patching.conditions import PatchSpec
from vlens.patching.fast import FastPlan, count_chunks
from vlens.patching.metrics import AnswerMetrics, MetricFunction, Summary
from vlens.patching.pairs import PairBatch
from vlens.patching.runner import NaivePlan
from vlens.utils.errors import UserInputError

if TYPE_CHECKING:
    from vlens.core.model import HookedVLM


def pair_chunks(n_pairs: int, batch_size: int | None) -> list[list[int]]:
    """The rows of each pair chunk (one chunk with every pair unless `batch_size` < n_pairs)."""
    if batch_size is not None and batch_size < 1:
        raise UserInputError(f"batch_size must be >= 1, got {batch_size}")
    size = n_pairs if batch_size is None else min(batch_size, n_pairs)
    return [list(range(start, min(start + size, n_pairs))) for start in range(0, n_pairs, size)]


def run_specs_reduced(
    model: HookedVLM, batch: PairBatch, specs: Sequence[PatchSpec],
    metric: AnswerMetrics | MetricFunction | None = None, options: SweepOptions | None = None,
) -> Summary:
    """Every condition's metric values, computed in the same batches as one process would.

    metric: what each unit keeps of its patched readout logits (default: the answer metrics,
        `AnswerMetrics`: per pair the logit difference and the argmax token), so results stay
        small however large the vocabulary is; `summarize` then adds the unpatched runs.
    options: `readout` (where the logits are read, `PairBatch.readout_positions`), `implementation`
        ("fast" or "naive"), `batch_size` (pairs per chunk), `max_batch`, `progress`, `sharding`
        (split the forwards across processes; every process returns the full result), `cache_device`.
    """
    options = SweepOptions() if options is None else options
    method = options.implementation
    metric = metric if metric is not None else AnswerMetrics(batch.clean_tokens, batch.corrupt_tokens)
    positions = batch.readout_positions(options.readout)
    sharding, max_batch = options.shards, options.max_batch
    chunks = pair_chunks(batch.n_pairs, options.batch_size)
    if len(chunks) > 1 and isinstance(metric, MetricFunction) and not metric.takes_rows:
        raise UserInputError("with SweepOptions.batch_size the metric sees one chunk of pairs at a time: give it a "
                             "second argument, metric(logits, rows), to know which pairs (rows: their batch "
                             "indices), or drop batch_size")
    units = []
    for p, rows in enumerate(chunks):
        count = count_chunks(specs, len(rows), max_batch) if method == "fast" else len(specs)
        units += [(p, c) for c in range(count)]
    plans: dict[int, FastPlan | NaivePlan] = {}  # the current pair chunk's plan

    def plan_for(p: int) -> FastPlan | NaivePlan:
        if p not in plans:
            plans.clear()
            rows = chunks[p]
            sub_batch, sub_specs, sub_read = batch, list(specs), positions
            if len(chunks) > 1:
                sub_batch = batch.select(rows)
                sub_specs = [replace(s, positions=s.positions[rows]) for s in specs]
                sub_read = positions[rows]
            plans[p] = FastPlan(model, sub_batch, sub_specs, max_batch, sub_read, options.cache_device) \
                if method == "fast" else NaivePlan(model, sub_batch, sub_specs, sub_read, options.cache_device)
        return plans[p]

    def run(unit: tuple[int, int]) -> dict:
        p, c = unit
        plan = plan_for(p)
        indices, logits = plan.run_chunk(c)
        chunk_metric = metric.subset(chunks[p])
        per_spec = [chunk_metric(logits[j]) for j in range(len(indices))]  # name -> [n_pairs] or []
        out: dict = {"specs": list(indices),
                     "values": {name: torch.stack([v[name] for v in per_spec]) for name in per_spec[0]}
                     if per_spec else {}}
        if c == 0:
            out["clean_logits"] = plan.clean_logits.cpu()
            out["corrupt_logits"] = plan.corrupt_logits.cpu()
        return out

    results = sharding.map(units, run, desc=f"patching ({method})", progress=options.progress)
    plans.clear()
    values: dict[str, Tensor] = {}
    clean, corrupt = [], []
    for (p, _), result in zip(units, results, strict=True):
        pair_rows = torch.tensor(chunks[p])
        index = torch.tensor(result["specs"])
        for name, value in result["values"].items():
            if value.ndim == 1 and len(chunks) > 1:
                raise UserInputError(f"metric {name!r} returns one number per batch: it cannot be combined over "
                                     "pair chunks; return one value per pair (the sweep averages them) or drop "
                                     "SweepOptions.batch_size")
            if name not in values:
                shape = (len(specs), batch.n_pairs) if value.ndim == 2 else (len(specs),)
                values[name] = torch.zeros(shape, dtype=value.dtype)
            if value.ndim == 2:
                values[name][index[:, None], pair_rows[None, :]] = value
            else:
                values[name][index] = value
        if "clean_logits" in result:
            clean.append(result["clean_logits"])
            corrupt.append(result["corrupt_logits"])
    if not clean:  # no condition at all: the baseline still needs the unpatched runs
        for p in range(len(chunks)):
            plan = plan_for(p)
            clean.append(plan.clean_logits.cpu())
            corrupt.append(plan.corrupt_logits.cpu())
    if not values and isinstance(metric, AnswerMetrics):
        values = {"logit_diff": torch.zeros(0, batch.n_pairs), "prediction": torch.zeros(0, batch.n_pairs,
                                                                                          dtype=torch.long)}
    return metric.summarize(values, torch.cat(clean), torch.cat(corrupt))

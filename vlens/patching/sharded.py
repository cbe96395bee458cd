"""Patch sweeps as independent work units, run by `Sharding.map` on one process or many.

A unit is one forward of the single-process sweep: (pair chunk, chunk of conditions) for the
fast path, (pair chunk, condition) for the naive one. Each process builds the plan of a pair
chunk (the clean and corrupt runs) when it first needs it and runs its share of the chunks.
A unit returns what the metrics read, per condition and pair: the logit difference and the
argmax token (`reduce_patched`), so results stay small however large the vocabulary is;
the first unit of each pair chunk also returns the unpatched logits (the baseline).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

import torch
from jaxtyping import Float, Int
from torch import Tensor

from vlens.parallel import Sharding
from vlens.patching.conditions import PatchSpec
from vlens.patching.fast import FastPlan, count_chunks
from vlens.patching.metrics import Baseline, reduce_patched
from vlens.patching.pairs import PairBatch
from vlens.patching.runner import NaivePlan

if TYPE_CHECKING:
    from vlens.model import HookedVLM


def pair_chunks(n_pairs: int, pair_batch_size: int | None) -> list[list[int]]:
    """The rows of each pair chunk (one chunk with every pair unless `pair_batch_size` < n_pairs)."""
    if pair_batch_size is not None and pair_batch_size < 1:
        raise ValueError(f"pair_batch_size must be >= 1, got {pair_batch_size}")
    size = n_pairs if pair_batch_size is None else min(pair_batch_size, n_pairs)
    return [list(range(start, min(start + size, n_pairs))) for start in range(0, n_pairs, size)]


def run_specs_reduced(
    model: HookedVLM, batch: PairBatch, specs: Sequence[PatchSpec], method: str = "fast", max_batch: int = 64,
    progress: bool = False, pair_batch_size: int | None = None, sharding: Sharding | None = None,
) -> tuple[Float[Tensor, "n_specs n_pairs"], Int[Tensor, "n_specs n_pairs"], Baseline]:
    """Per condition and pair: the patched logit difference and argmax token (CPU), and the Baseline.

    The values `patch_metrics` reads from `run_specs`'s logits, computed in the same batches.
    sharding: split the forwards across processes; every process returns the full result.
    """
    if method not in ("fast", "naive"):
        raise ValueError(f"unknown method {method!r}: use 'fast' or 'naive'")
    sharding = sharding or Sharding()
    chunks = pair_chunks(batch.n_pairs, pair_batch_size)
    units = []
    for p, rows in enumerate(chunks):
        count = count_chunks(specs, len(rows), max_batch) if method == "fast" else len(specs)
        units += [(p, c) for c in range(count)]
    plans: dict[int, FastPlan | NaivePlan] = {}  # the current pair chunk's plan

    def plan_for(p: int) -> FastPlan | NaivePlan:
        if p not in plans:
            plans.clear()
            rows = chunks[p]
            sub_batch, sub_specs = batch, list(specs)
            if len(chunks) > 1:
                sub_batch = batch.select(rows)
                sub_specs = [replace(s, positions=s.positions[rows]) for s in specs]
            plans[p] = FastPlan(model, sub_batch, sub_specs, max_batch) if method == "fast" \
                else NaivePlan(model, sub_batch, sub_specs)
        return plans[p]

    def run(unit: tuple[int, int]) -> dict:
        p, c = unit
        plan = plan_for(p)
        indices, logits = plan.run_chunk(c)
        per_pair, prediction = reduce_patched(logits, plan.baseline.clean_tokens, plan.baseline.corrupt_tokens)
        out = {"specs": list(indices), "logit_diff": per_pair, "prediction": prediction}
        if c == 0:
            out["clean_logits"] = plan.baseline.clean_logits.cpu()
            out["corrupt_logits"] = plan.baseline.corrupt_logits.cpu()
        return out

    results = sharding.map(units, run, desc=f"patching ({method})", progress=progress)
    plans.clear()
    per_pair = torch.zeros(len(specs), batch.n_pairs)
    prediction = torch.zeros(len(specs), batch.n_pairs, dtype=torch.long)
    clean, corrupt = [], []
    for (p, _), result in zip(units, results, strict=True):
        rows = torch.tensor(chunks[p])
        index = torch.tensor(result["specs"])
        per_pair[index[:, None], rows[None, :]] = result["logit_diff"]
        prediction[index[:, None], rows[None, :]] = result["prediction"]
        if "clean_logits" in result:
            clean.append(result["clean_logits"])
            corrupt.append(result["corrupt_logits"])
    if not clean:  # no condition at all: the baseline still needs the unpatched runs
        for p in range(len(chunks)):
            plan = plan_for(p)
            clean.append(plan.baseline.clean_logits.cpu())
            corrupt.append(plan.baseline.corrupt_logits.cpu())
    baseline = Baseline(torch.cat(clean), torch.cat(corrupt), batch.clean_tokens, batch.corrupt_tokens)
    return per_pair, prediction, baseline

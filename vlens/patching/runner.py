"""Running patch conditions (`vlens.patching.conditions`): the naive loop (one hooked forward
per condition) and the dispatcher `run_specs`.

`vlens.patching.fast.run_fast` gives the same logits (within float noise) with far less work.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import torch
from jaxtyping import Float, Int
from torch import Tensor
from tqdm.auto import tqdm

from vlens.parallel.options import SweepOptions, fold_legacy
from vlens.patching.conditions import PatchSpec, corrupt_activations, gather_positions, patch_hook
from vlens.patching.fast import run_fast
from vlens.patching.metrics import Baseline, final_baseline
from vlens.patching.pairs import PairBatch

if TYPE_CHECKING:
    from vlens.core.model import HookedVLM

# ---------------------------------------------------------------------- naive
class NaivePlan:
    """The naive loop over one pair batch: the unpatched runs once, then one hooked forward per
    condition (`run_chunk(c)` runs condition c; the same interface as `fast.FastPlan`)."""

    def __init__(self, model: HookedVLM, batch: PairBatch, specs: Sequence[PatchSpec],
                 readout: Int[Tensor, "n_pairs n_readout"] | None = None,
                 cache_device: torch.device | str | None = None):
        self.model, self.batch, self.specs = model, batch, list(specs)
        self.readout = batch.readout_positions() if readout is None else readout
        self.corrupt_logits, self.cache = corrupt_activations(model, batch, {s.hook_name for s in self.specs},
                                                              self.readout, cache_device)
        with torch.no_grad():
            self.clean_logits = gather_positions(model(batch.clean), self.readout)
        self.chunks = [[i] for i in range(len(self.specs))]

    def run_chunk(self, chunk: int) -> tuple[list[int], Float[Tensor, "1 n_pairs n_readout d_vocab"]]:
        spec = self.specs[chunk]
        with torch.no_grad():
            logits = self.model.run_with_hooks(self.batch.clean, fwd_hooks=[
                (spec.hook_name, patch_hook([spec], self.cache[spec.hook_name]))])
        return [chunk], gather_positions(logits, self.readout)[None]


def run_naive(model: HookedVLM, batch: PairBatch, specs: Sequence[PatchSpec], options: SweepOptions | None = None,
              **legacy: Any) -> tuple[Float[Tensor, "n_specs n_pairs d_vocab"], Baseline]:
    """Reference implementation: one full `run_with_hooks` forward per condition.

    options: `progress` and `cache_device` (`vlens.SweepOptions`).
    Returns (patched final logits [n_specs, n_pairs, d_vocab], Baseline).
    """
    options = fold_legacy(options, legacy, "run_naive", ("progress",))
    plan = NaivePlan(model, batch, specs, cache_device=options.cache_device)
    outs = [plan.run_chunk(c)[1][0, :, 0] for c in tqdm(range(len(specs)), desc="patching (naive)",
                                                       disable=not options.progress)]
    baseline = final_baseline(batch, plan.clean_logits, plan.corrupt_logits)
    return torch.stack(outs) if outs else baseline.clean_logits.new_zeros(0, *baseline.clean_logits.shape), baseline


def run_specs(model: HookedVLM, batch: PairBatch, specs: Sequence[PatchSpec], options: SweepOptions | None = None,
              **legacy: Any) -> tuple[Float[Tensor, "n_specs n_pairs d_vocab"], Baseline]:
    """Run conditions with `run_fast` or `run_naive` (`options.implementation`), optionally
    `options.batch_size` pairs at a time.

    options: `implementation`, `batch_size` (pairs per chunk), `max_batch`, `progress`, `cache_device`.
    Returns (patched final logits [n_specs, n_pairs, d_vocab], Baseline).
    """
    options = fold_legacy(options, legacy, "run_specs", ("method", "max_batch", "progress", "pair_batch_size"))
    size = options.batch_size
    if size is None or size >= batch.n_pairs:
        if options.implementation == "fast":
            return run_fast(model, batch, specs, options=options)
        return run_naive(model, batch, specs, options=options)
    parts = []
    for start in range(0, batch.n_pairs, size):
        rows = list(range(start, min(start + size, batch.n_pairs)))
        sub_specs = [replace(s, positions=s.positions[rows]) for s in specs]
        parts.append(run_specs(model, batch.select(rows), sub_specs, options.replace(batch_size=None)))
    baseline = Baseline(
        torch.cat([b.clean_logits for _, b in parts]), torch.cat([b.corrupt_logits for _, b in parts]),
        batch.clean_tokens, batch.corrupt_tokens,
    )
    return torch.cat([logits for logits, _ in parts], dim=1), baseline

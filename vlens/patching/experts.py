"""Patching expert outputs of mixture-of-experts layers (docs/moe.md).

A MoE layer's routed output is a sum of expert contributions, c_e = sum over the slots k where expert e
was chosen of weight_k * expert_out_k (zero where the router did not choose e). Patching expert e of
layer l writes the corrupt run's contribution of e in place of the clean run's, at the positions of a
region, and runs the rest of the model:

    routed_out' = routed_out - c_e(clean) + c_e(corrupt)         (`blocks.{l}.mlp.hook_routed_out`)

so the corrupt run's routing to e comes with it (e's weight, or its absence where the corrupt run did
not choose it), as patching a head carries its whole output. The other experts and the shared expert
keep the clean run's values. Metrics, noise floor, intervals and directions are the head sweep's
(`vlens.patching.sweeps`); the result is a `PatchingResult` of mode "layer-expert" ([n_layers, n_experts]).

    result = patch_layer_expert(model, build_pair_batch(model, make_count_pairs(16)), region="image")
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor
from tqdm.auto import tqdm

from vlens.core.runtime import RunState
from vlens.parallel.options import SweepOptions, fold_legacy
from vlens.patching.conditions import gather_positions, readout_logits
from vlens.patching.fast import repeat_run_state
from vlens.patching.metrics import MetricFn, as_metric
from vlens.patching.pairs import PairBatch
from vlens.patching.results import PatchingResult
from vlens.patching.sweeps import REGIONS, oriented, result_from_summary
from vlens.utils.errors import UserInputError

if TYPE_CHECKING:
    from vlens.core.model import HookedVLM

KINDS = ("indices", "weights", "out")


def expert_contribution(indices: Int[Tensor, "batch pos k"], weights: Float[Tensor, "batch pos k"],
                        out: Float[Tensor, "batch pos k d_model"], expert: int) -> Float[Tensor, "batch pos d_model"]:
    """What expert `expert` adds to the routed output: sum over the slots that chose it of weight * output."""
    chosen = (indices == expert).to(out.dtype)
    return ((chosen * weights.to(out.dtype))[..., None] * out).sum(dim=2)


def expert_patch_hooks(layer: int, experts: Sequence[int], corrupt: dict[str, Tensor],
                       positions: Bool[Tensor, "batch pos"], together: bool = False) -> list:
    """Hooks on `layer`'s MoE MLP for a batch stacked len(experts) times: copy g has expert experts[g]'s
    contribution replaced by the corrupt run's at `positions`. corrupt: the corrupt run's
    "indices", "weights", "out" (`hook_expert_*` of the layer, [batch, pos, ...]). together=True: one copy,
    every listed expert patched."""
    store: dict[str, Tensor] = {}
    groups = [list(experts)] if together else [[e] for e in experts]
    batch = positions.shape[0]

    def keep(kind: str):
        def hook(activation: Tensor, hook=None) -> None:
            store[kind] = activation
        return hook

    def patch(routed: Tensor, hook=None) -> Tensor:
        if routed.shape[0] != batch * len(groups):
            raise RuntimeError(f"hook_routed_out batch {routed.shape[0]} != {len(groups)} copies x {batch} rows")
        source = {kind: corrupt[kind].to(routed.device) for kind in KINDS}
        mask = positions.to(routed.device)[..., None]
        pieces = []
        for g, group in enumerate(groups):
            rows = slice(g * batch, (g + 1) * batch)
            delta = torch.zeros_like(routed[rows])
            for expert in group:
                delta = delta + expert_contribution(source["indices"], source["weights"], source["out"], expert) \
                    - expert_contribution(store["indices"][rows], store["weights"][rows], store["out"][rows], expert)
            pieces.append(torch.where(mask, routed[rows] + delta.to(routed.dtype), routed[rows]))
        return torch.cat(pieces)

    base = f"blocks.{layer}.mlp"
    return [(f"{base}.hook_expert_{kind}", keep(kind)) for kind in KINDS] + [(f"{base}.hook_routed_out", patch)]


def patch_layer_expert(model: HookedVLM, batch: PairBatch, region: str = "all", layers: Sequence[int] | None = None,
                       experts: Sequence[int] | None = None, metric: MetricFn | None = None,
                       direction: str = "noising", options: SweepOptions | None = None,
                       **legacy: Any) -> PatchingResult:
    """Patch one expert's contribution at a time (at `region`'s positions: "all", "image", "text", "final").

    Each condition resumes from the clean residual entering its layer (exact: earlier layers are
    untouched); conditions of a layer run together as copies of the pairs, at most
    `options.max_batch` rows per forward.

    Args:
        model: a mixture-of-experts model.
        batch: the pairs (`build_pair_batch`).
        region: the positions patched, one of `REGIONS`.
        layers: the MoE layers patched (default all); experts: the experts (default all).
        metric: default the answer metrics; or ``metric(logits [n_pairs, n_readout, d_vocab])``.
        direction: "noising" (corrupt contributions into the clean run) or "denoising".
        options: `max_batch`, `readout`, `progress` (`vlens.SweepOptions`); one process only.
    Returns:
        a `PatchingResult` of mode "layer-expert" with metrics [n_layers, n_experts].
    """
    options = fold_legacy(options, legacy, "patch_layer_expert", ("max_batch", "progress", "readout"))
    max_batch, progress, readout = options.max_batch, options.progress, options.readout
    if options.shards.world_size > 1:
        raise UserInputError("patch_layer_expert runs in one process: drop SweepOptions.sharding")
    if region not in REGIONS:
        raise UserInputError(f"unknown region {region!r}: use one of {REGIONS}")
    cfg = model.cfg
    moe = list(cfg.moe_layers)
    if not moe:
        raise UserInputError(f"{cfg.architecture} has no mixture-of-experts layer: expert patching needs a MoE model")
    layers = moe if layers is None else [int(x) for x in layers]
    bad = [x for x in layers if x not in moe]
    if bad:
        raise UserInputError(f"layers {bad} have no mixture of experts (MoE layers: {moe})")
    experts = list(range(cfg.n_experts)) if experts is None else [int(e) for e in experts]
    if any(not 0 <= e < cfg.n_experts for e in experts):
        raise UserInputError(f"experts {experts} are not valid: the model has experts 0..{cfg.n_experts - 1}")
    if metric is None and readout != "final":
        raise UserInputError("the default answer metrics read the final position: pass metric=... to read "
                             f"readout={readout!r}")
    given, batch = batch, oriented(batch, direction)
    scorer = as_metric(metric, batch, getattr(cfg, "dtype", None))
    reads = batch.readout_positions(readout)
    positions = batch.region_mask(region)
    names = {f"blocks.{layer}.mlp.hook_expert_{kind}" for layer in layers for kind in KINDS}
    with torch.no_grad():
        logits, cache = model.run_with_cache(batch.corrupt, names_filter=lambda n: n in names)
        corrupt_logits = gather_positions(logits, reads)
        state = model.start_run(batch.clean)
        resids = [state.resid]
        for layer in range(cfg.n_layers):
            resids.append(model.run_blocks(resids[-1], state, layer, layer + 1))
        clean_logits = readout_logits(model, resids[-1], reads)
    n = batch.n_pairs
    per_chunk = max(1, max_batch // n)
    values: dict[str, list[Tensor]] = {}
    repeated: dict[int, RunState] = {}
    work = [(layer, experts[s:s + per_chunk]) for layer in layers for s in range(0, len(experts), per_chunk)]
    for layer, group in tqdm(work, desc="patching experts", disable=not progress):
        corrupt = {kind: cache[f"blocks.{layer}.mlp.hook_expert_{kind}"] for kind in KINDS}
        copies = len(group)
        if copies not in repeated:
            repeated[copies] = repeat_run_state(state, copies)
        with torch.no_grad(), model.hooks(fwd_hooks=expert_patch_hooks(layer, group, corrupt, positions)):
            resid = model.run_blocks(resids[layer].repeat(copies, 1, 1), repeated[copies], layer, None)
            logits = readout_logits(model, resid, reads.repeat(copies, 1)).view(copies, n, *reads.shape[1:], -1)
        for g in range(copies):
            for name, value in scorer(logits[g].cpu()).items():
                values.setdefault(name, []).append(value)
    summary = scorer.summarize({name: torch.stack(v) for name, v in values.items()}, clean_logits.cpu(),
                               corrupt_logits.cpu())
    axes = {"mode": "layer-expert", "component": "expert", "layers": layers, "cells": experts, "readout": readout,
            "region": region}
    return result_from_summary(model, given, batch, summary, scorer, axes, direction)

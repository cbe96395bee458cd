"""Sweep: ablate every head alone (layer x head) on a task and measure the damage.

Cost: one clean forward per chunk of examples; then per layer l, the heads of l are run in
groups of `heads_per_pass`, the chunk stacked once per head, resuming from the cached clean
residual entering block l (exact: blocks before l are untouched by an ablation at l).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
from jaxtyping import Float, Int
from torch import Tensor

from vlens.ablation.hooks import check_method, replacement_values, stacked_head_hook
from vlens.ablation.reference import ReferenceActivations, resample_partners
from vlens.ablation.results import HeadAblation
from vlens.ablation.tasks import TaskBatch
from vlens.core.answers import answer_logprobs
from vlens.core.final_block import block_has_hooks, last_block_at, supports_last_block_at
from vlens.core.hooks import act_name
from vlens.core.runtime import RunState, build_masks
from vlens.parallel.options import SweepOptions, fold_legacy
from vlens.utils.finite import finite_rows, warn_non_finite

if TYPE_CHECKING:
    from vlens.core.model import HookedVLM


def answer_metrics(
    answer_logits: Float[Tensor, "batch k d_vocab"], answers: Sequence[Sequence[int]]
) -> tuple[Float[Tensor, "batch"], Float[Tensor, "batch"]]:
    """(whole-answer teacher-forced log-probability, 1.0 where every answer token is the argmax)
    per row, from the logits of the last k >= len(answer) positions (`vlens.core.answers.answer_logprobs`);
    both NaN where the row's logits are not finite."""
    if answer_logits.ndim == 2:  # [batch, d_vocab]: one position
        answer_logits = answer_logits[:, None]
    logprob, exact = answer_logprobs(answer_logits, answers)
    ok = finite_rows(answer_logits.flatten(1)).cpu()
    return logprob.masked_fill(~ok, torch.nan), exact.float().masked_fill(~ok, torch.nan)


def final_position_logits(model: HookedVLM, resid: Float[Tensor, "batch pos d_model"],
                          final: Int[Tensor, "batch"], k: int = 1) -> Float[Tensor, "batch k d_vocab"]:
    """Logits at each row's last k positions ending at `final` (unembeds only those)."""
    return model.finish(last_positions(resid, final, k))


def last_positions(values: Tensor, final: Int[Tensor, "batch"], k: int) -> Tensor:
    """values[b, final[b] - k + 1 .. final[b]] -> [batch, k, ...]."""
    positions = read_positions(final.to(values.device), k)
    return values[torch.arange(values.shape[0], device=values.device)[:, None], positions]


def read_positions(final: Int[Tensor, "batch"], k: int) -> Int[Tensor, "batch k"]:
    """Each row's last k positions ending at `final` (clamped at 0): where the answer is read."""
    return (final[:, None] + torch.arange(1 - k, 1, device=final.device)).clamp(min=0)


def run_to_answer_logits(model: HookedVLM, resid: Float[Tensor, "batch pos d_model"], state: RunState, layer: int,
                         final: Int[Tensor, "batch"], k: int) -> Float[Tensor, "batch k d_vocab"]:
    """Logits at each row's last k positions ending at `final`, running blocks `layer`.. on `resid` (the
    residual entering `layer`). The last block runs at those positions only (its queries, output
    projection and MLP; its keys and values at every position: `vlens.core.final_block`) when it is a plain
    block with no hook attached (so not the ablated one); otherwise every block runs whole."""
    last = model.cfg.n_layers - 1
    block = model.blocks[last]
    if supports_last_block_at(block) and not block_has_hooks(block):
        resid = model.run_blocks(resid, state, layer, last)
        return model.finish(last_block_at(model, resid, state, read_positions(final.to(resid.device), k)))
    return final_position_logits(model, model.run_blocks(resid, state, layer, None), final, k)


def stack_state(state: RunState, attention_mask: Tensor, copies: int) -> RunState:
    """The run state of the batch repeated `copies` times along the batch dimension."""
    if copies == 1:
        return state

    def rep(t: Tensor) -> Tensor:
        return t.repeat(copies, *([1] * (t.ndim - 1)))

    batch, pos = attention_mask.shape
    blocks = None if state.masks.blocks is None else rep(state.masks.blocks)
    masks = build_masks(rep(attention_mask), batch * copies, pos, 0, state.masks.dtype, state.resid.device,
                        blocks=blocks)
    deepstack = {layer: (rep(mask), rep(feats)) for layer, (mask, feats) in state.deepstack.items()}
    return RunState(resid=rep(state.resid), cos=rep(state.cos), sin=rep(state.sin), masks=masks,
                    position_ids=state.position_ids, rope_deltas=state.rope_deltas, deepstack=deepstack)


def head_ablation_sweep(
    model: HookedVLM,
    task: TaskBatch,
    method: str = "mean",
    reference: ReferenceActivations | None = None,
    layers: Sequence[int] | None = None,
    seed: int = 0,
    resume: bool = True,
    options: SweepOptions | None = None,
    **legacy: Any,
) -> HeadAblation:
    """Ablate each head of `layers` (default all) alone on `task`; mean damage per head.

    Args:
        model: the model.
        task: evaluation examples (answers of any length: whole-answer log-probability, `vlens.core.answers`).
        method: "mean" (reference means), "zero", or "resample" (a seeded reference example
            per evaluation example, aligned like the means).
        reference: from `collect_reference` on a reference set disjoint from `task`.
        layers: the layers whose heads are ablated (default all); heads outside them keep NaN.
        seed: the resampling seed (method "resample").
        resume: resume from the cached clean residual at the ablated layer; False runs the
            whole model with `run_with_hooks` per head (the plain, slower reference path).
        options: `batch_size` (evaluation examples per forward, default 16), `heads_per_pass`
            (heads of one layer run together, the chunk stacked once per head), `progress`,
            `sharding` (one unit per (chunk of examples, layer) across processes; every process
            returns the full result), `cache_device` (where each chunk's clean residuals are kept).
    Returns:
        a `HeadAblation`: ablated_logprob / ablated_accuracy [n_layers, n_heads] (means over examples).
    Heads outside `layers` keep NaN, as do the cells beyond a layer's own heads where layers differ
    (a hybrid decoder's linear-attention layers: their heads are its value heads, `hook_z` before out_proj).
    """
    options = fold_legacy(options, legacy, "head_ablation_sweep", ("batch_size", "heads_per_pass", "progress",
                                                                   "sharding"))
    options.require_final("head_ablation_sweep")
    check_method(method, reference)
    batch_size, heads_per_pass, progress = options.batch(16), options.heads_per_pass, options.progress
    sharding = options.shards
    cfg = model.cfg
    layers = list(range(cfg.n_layers)) if layers is None else list(layers)
    n = len(task)
    # (check_method refused resample without a reference)
    partners = resample_partners(n, reference.n_examples, seed) if method == "resample" and reference else None
    chunks = [range(s, min(s + batch_size, n)) for s in range(0, n, batch_size)]
    clean_runs: dict[int, _CleanChunk] = {}  # the current chunk's clean run

    def run(unit: tuple[int, int]) -> dict:
        c, layer = unit
        if c not in clean_runs:
            clean_runs.clear()
            clean_runs[c] = _CleanChunk(model, task, chunks[c], reference, partners, options.cache_device)
        chunk = clean_runs[c]
        out = chunk.ablate_layer(model, method, layer, heads_per_pass, resume)
        if layer == layers[0]:
            out["clean"] = (chunk.clean_lp, chunk.clean_acc)
        return out

    units = [(c, layer) for c in range(len(chunks)) for layer in layers]
    with torch.no_grad():
        results = sharding.map(units, run, desc=f"ablate {task.name}", progress=progress)
    clean_runs.clear()
    # [n_layers, widest layer's heads, n]: a layer with fewer heads (hybrid decoders) keeps NaN beyond them
    clean_lp, clean_acc, abl_lp, abl_acc = gather_units(units, results, chunks, cfg.n_layers, cfg.max_heads, n)
    _report_non_finite(model, task, chunks, clean_lp, abl_lp, layers)
    return HeadAblation(
        task=task.name, method=method, alignment=reference.alignment if reference is not None else "none",
        n_examples=n, clean_logprob=float(clean_lp.mean()), clean_accuracy=float(clean_acc.mean()),
        ablated_logprob=abl_lp.mean(dim=-1).double(), ablated_accuracy=abl_acc.mean(dim=-1).double(),
        answers=list(task.answers), answer_tokens=[list(a) for a in task.answer_tokens],
        heads_per_layer=None if cfg.uniform_heads else [cfg.heads_at(layer) for layer in range(cfg.n_layers)],
    )


def gather_units(units: list[tuple[int, int]], results: list[dict], chunks: list[range], n_layers: int, width: int,
                 n: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """A sweep's per-(chunk, layer) unit results assembled: clean log-prob and accuracy [n], and with each
    unit (head, expert) of each layer ablated [n_layers, width, n] (NaN where nothing was measured).

    results[i] belongs to units[i] = (chunk, layer): "logprob" / "accuracy" lists (one [rows] tensor per
    unit of the layer) and, for one layer per chunk, "clean" = (log-prob, accuracy)."""
    clean_lp, clean_acc = torch.zeros(n), torch.zeros(n)
    abl_lp = torch.full((n_layers, width, n), float("nan"))
    abl_acc = torch.full((n_layers, width, n), float("nan"))
    for (c, layer), out in zip(units, results, strict=True):
        rows = list(chunks[c])
        if "clean" in out:
            clean_lp[rows], clean_acc[rows] = out["clean"]
        for unit, (lp, acc) in enumerate(zip(out["logprob"], out["accuracy"], strict=True)):
            abl_lp[layer, unit, rows], abl_acc[layer, unit, rows] = lp, acc
    return clean_lp, clean_acc, abl_lp, abl_acc


def _report_non_finite(model: HookedVLM, task: TaskBatch, chunks: list[range], clean_lp: Tensor, abl_lp: Tensor,
                       layers: list[int]) -> None:
    """Warn about NaN answer metrics: the unablated run (located in the model), else ablated heads."""
    bad_rows = clean_lp.isnan().nonzero().flatten().tolist()
    if bad_rows:
        chunk = next(rows for rows in chunks if bad_rows[0] in rows)
        warn_non_finite(f"ablation ({task.name})", f"the unablated run of examples {bad_rows[:6]}", model,
                        task.inputs(model, chunk))
        return
    broken = [(layer, head) for layer in layers for head in range(model.cfg.heads_at(layer))
              if bool(abl_lp[layer, head].isnan().any())]
    if broken:
        warn_non_finite(f"ablation ({task.name})", "ablating heads " + ", ".join(f"L{a}H{b}" for a, b in broken[:6])
                        + (f" (+{len(broken) - 6} more)" if len(broken) > 6 else ""))


class CleanChunk:
    """One chunk of evaluation examples and its clean run: the residual entering every layer, the
    answer metrics without ablation, and the run state stacked for groups of copies. What an ablation of
    any unit (head, expert) of any layer resumes from."""

    def __init__(self, model: HookedVLM, task: TaskBatch, rows: range, cache_device: torch.device | str | None = None):
        self.inputs = task.inputs(model, rows)
        self.answers = [task.answer_tokens[r] for r in rows]
        self.k = max(len(a) for a in self.answers)
        self.n_rows = len(rows)
        self.state = model.start_run(self.inputs)
        # each layer's clean input, kept on cache_device (and returned to where it was computed when used)
        resid, self.layer_inputs, self.layer_devices = self.state.resid, [], []
        last = model.cfg.n_layers - 1
        for layer in range(model.cfg.n_layers):
            self.layer_inputs.append(resid if cache_device is None else resid.to(cache_device))
            self.layer_devices.append(resid.device)
            if layer < last:
                resid = model.run_blocks(resid, self.state, layer, layer + 1)
        self.clean_lp, self.clean_acc = answer_metrics(  # the last block at the answer positions only
            run_to_answer_logits(model, resid, self.state, last, self.inputs.token_regions.final, self.k),
            self.answers)
        self.stacked: dict[int, RunState] = {}  # copies -> the chunk's run state stacked that often

    def copies_metrics(self, model: HookedVLM, layer: int, hooks: list, copies: int,
                       resume: bool = True) -> tuple[list[Tensor], list[Tensor]]:
        """Answer log-prob and accuracy [n_rows] of each of `copies` copies of the chunk, run with `hooks`
        (each copy ablating its own unit of `layer`): resumed from the clean residual entering `layer`,
        or (resume=False, one copy) the whole model with `run_with_hooks`."""
        if resume and copies not in self.stacked:
            self.stacked[copies] = stack_state(self.state, self.inputs.attention_mask, copies)
        final = self.inputs.token_regions.final
        if not resume:
            if copies != 1:
                raise RuntimeError("the plain path (resume=False) runs one copy at a time")
            logits = last_positions(model.run_with_hooks(self.inputs, fwd_hooks=hooks), final, self.k)
        else:
            with model.hooks(fwd_hooks=hooks):
                layer_input = self.layer_inputs[layer].to(self.layer_devices[layer])
                logits = run_to_answer_logits(model, layer_input.repeat(copies, 1, 1), self.stacked[copies], layer,
                                              final.repeat(copies), self.k)
        logprob, accuracy = [], []
        for g in range(copies):
            lp, acc = answer_metrics(logits[g * self.n_rows:(g + 1) * self.n_rows], self.answers)
            logprob.append(lp)
            accuracy.append(acc)
        return logprob, accuracy


class _CleanChunk(CleanChunk):
    """A clean chunk and what ablating a head of any layer needs (reference means, resampling partners)."""

    def __init__(self, model: HookedVLM, task: TaskBatch, rows: range, reference: ReferenceActivations | None,
                 partners: list[int] | None, cache_device: torch.device | str | None = None):
        super().__init__(model, task, rows, cache_device)
        self.reference = reference
        self.slot_ids = reference.slot_ids(self.inputs) if reference is not None else None
        self.partners = None if partners is None else [partners[r] for r in rows]

    def ablate_layer(self, model: HookedVLM, method: str, layer: int, heads_per_pass: int, resume: bool) -> dict:
        """Answer log-prob and accuracy [n_rows] with each head of `layer` ablated alone, head by head."""
        n_heads = model.cfg.heads_at(layer)
        values = replacement_values(model, method, layer, self.inputs, self.reference, self.partners, self.slot_ids)
        real = self.inputs.attention_mask.bool()
        logprob, accuracy = [], []
        for start in range(0, n_heads, heads_per_pass if resume else 1):
            heads = list(range(start, min(start + heads_per_pass, n_heads))) if resume else [start]
            hook = (act_name("z", layer), stacked_head_hook(heads, values, real))
            lp, acc = self.copies_metrics(model, layer, [hook], len(heads), resume)
            logprob += lp
            accuracy += acc
        return {"logprob": logprob, "accuracy": accuracy}

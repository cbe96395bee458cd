"""Run patch conditions: the naive loop (one hooked forward per condition) and the fast path.

A condition (`PatchSpec`) writes the corrupt run's activation at one hook point, at some
positions (and for `hook_z` one head), into the clean run. Its semantics are exactly
``model.run_with_hooks(clean_inputs, fwd_hooks=[(name, hook)])`` where the hook sets
``act[row, pos(, head)] = corrupt_cache[name][row, pos(, head)]``.

The fast path gives the same logits (within float noise) with far less work:
- the vision tower runs once per batch (clean and corrupt), not once per condition;
- the clean run caches the residual entering every layer, and a condition at layer l
  resumes from it (`model.run_blocks(resid, state, l, None)`): layers before l are not rerun;
- several conditions run in one forward, as copies of the batch stacked along the batch
  dimension, each copy patching its own cell;
- the last block runs for the final position only (`final_block`): only its logits are read.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from jaxtyping import Float
from torch import Tensor
from tqdm.auto import tqdm

from vlens.components.attention import AttentionMasks
from vlens.hooks import act_name
from vlens.patching.final_block import block_has_hooks, last_block_at_final
from vlens.patching.metrics import Baseline
from vlens.patching.pairs import PairBatch
from vlens.runtime import RunState

if TYPE_CHECKING:
    from vlens.model import HookedVLM

COMPONENTS: tuple[str, ...] = ("resid_pre", "resid_mid", "resid_post", "attn_out", "mlp_out", "z", "q", "k", "v")


@dataclass(frozen=True)
class PatchSpec:
    """One condition: patch `component` of `layer` at `positions` (bool [n_pairs, seq_len]), one head for "z"."""

    layer: int
    component: str
    positions: Tensor
    head: int | None = None

    @property
    def hook_name(self) -> str:
        return act_name(self.component, self.layer)


def check_component(component: str) -> None:
    if component not in COMPONENTS:
        raise ValueError(f"unknown component {component!r}: patch one of {COMPONENTS}")


def _patch_mask(specs: Sequence[PatchSpec], act: Tensor) -> Tensor:
    """bool mask broadcastable to `act` ([k*n, pos, d] or [k*n, pos, H, d]) for k stacked specs."""
    masks = []
    for spec in specs:
        positions = spec.positions.to(act.device)
        if act.ndim == 4:  # per-head activation: only this spec's head
            per_head = torch.zeros(*positions.shape, act.shape[2], dtype=torch.bool, device=act.device)
            if spec.head is None:
                per_head[:] = positions[..., None]
            else:
                per_head[..., spec.head] = positions
            masks.append(per_head)
        else:
            masks.append(positions)
    return torch.cat(masks)[..., None]


def patch_hook(specs: Sequence[PatchSpec], corrupt_act: Tensor):
    """A forward hook writing `corrupt_act` ([n, ...]) into each stacked copy where its spec says."""
    def hook(act: Tensor, hook=None) -> Tensor:
        mask = _patch_mask(specs, act)
        source = corrupt_act.to(act.device, act.dtype).repeat(len(specs), *([1] * (act.ndim - 1)))
        return torch.where(mask, source, act)

    return hook


def final_logits(model: HookedVLM, resid: Float[Tensor, "batch pos d_model"], final: Tensor) -> Float[Tensor, "batch d_vocab"]:
    """Logits at each row's final position from the last residual stream."""
    rows = torch.arange(resid.shape[0], device=resid.device)
    return model.finish(resid[rows, final.to(resid.device)][:, None, :])[:, 0]


def corrupt_activations(model: HookedVLM, batch: PairBatch, names: set[str]):
    """Corrupt-run final logits [n, d_vocab] and the cached activations at `names`."""
    with torch.no_grad():
        logits, cache = model.run_with_cache(batch.corrupt, names_filter=lambda n: n in names)
    rows = torch.arange(batch.n_pairs)
    return logits[rows, batch.corrupt.regions.final.to(logits.device)], cache


# ---------------------------------------------------------------------- naive
def run_naive(model: HookedVLM, batch: PairBatch, specs: Sequence[PatchSpec], progress: bool = False):
    """Reference implementation: one full `run_with_hooks` forward per condition.

    Returns (patched final logits [n_specs, n_pairs, d_vocab], Baseline).
    """
    corrupt_logits, cache = corrupt_activations(model, batch, {s.hook_name for s in specs})
    rows = torch.arange(batch.n_pairs)
    final = batch.final
    outs = []
    with torch.no_grad():
        clean_logits = model(batch.clean)[rows, final.to(corrupt_logits.device)]
        for spec in tqdm(specs, desc="patching (naive)", disable=not progress):
            logits = model.run_with_hooks(batch.clean, fwd_hooks=[(spec.hook_name, patch_hook([spec], cache[spec.hook_name]))])
            outs.append(logits[rows, final.to(logits.device)])
    baseline = Baseline(clean_logits, corrupt_logits, batch.clean_tokens, batch.corrupt_tokens)
    return torch.stack(outs) if outs else clean_logits.new_zeros(0, *clean_logits.shape), baseline


# ---------------------------------------------------------------------- fast
def repeat_run_state(state: RunState, k: int) -> RunState:
    """The run state of `k` copies of the batch stacked along the batch dimension (copy-major)."""
    if k == 1:
        return state

    def rep(t: Tensor | None, dim: int = 0) -> Tensor | None:
        if t is None:
            return None
        sizes = [1] * t.ndim
        sizes[dim] = k
        return t.repeat(*sizes)

    masks = AttentionMasks(sdpa=rep(state.masks.sdpa), allowed=rep(state.masks.allowed), dtype=state.masks.dtype)
    position_ids = state.position_ids
    position_ids = rep(position_ids, 1 if position_ids.ndim == 3 else 0)
    # DeepStack features are flattened over image tokens in row order: copy-major repeat keeps that order.
    deepstack = {layer: (rep(mask), rep(feats)) for layer, (mask, feats) in state.deepstack.items()}
    return RunState(resid=rep(state.resid), cos=rep(state.cos), sin=rep(state.sin), masks=masks,
                    position_ids=position_ids, rope_deltas=rep(state.rope_deltas), deepstack=deepstack, kv_cache=None)


def clean_layer_inputs(model: HookedVLM, state: RunState) -> list[Tensor]:
    """The clean residual entering each layer, plus the final residual: n_layers + 1 tensors."""
    resids = [state.resid]
    for layer in range(model.cfg.n_layers):
        resids.append(model.run_blocks(resids[-1], state, layer, layer + 1))
    return resids


def run_fast(model: HookedVLM, batch: PairBatch, specs: Sequence[PatchSpec], max_batch: int = 64,
             progress: bool = False):
    """Same result as `run_naive` (within float noise), much faster; see the module docstring.

    max_batch: most rows (conditions x pairs) in one forward; conditions are batched in chunks.
    Returns (patched final logits [n_specs, n_pairs, d_vocab], Baseline).
    """
    n = batch.n_pairs
    corrupt_logits, cache = corrupt_activations(model, batch, {s.hook_name for s in specs})
    final = batch.final
    with torch.no_grad():
        state = model.start_run(batch.clean)
        resids = clean_layer_inputs(model, state)
        clean_logits = final_logits(model, resids[-1], final)
        groups: dict[tuple[int, str], list[int]] = defaultdict(list)
        for index, spec in enumerate(specs):
            groups[(spec.layer, spec.component)].append(index)
        per_chunk = max(1, max_batch // n)
        chunks = [(key, idx[i:i + per_chunk]) for key, idx in groups.items() for i in range(0, len(idx), per_chunk)]
        out: list[Tensor | None] = [None] * len(specs)
        states: dict[int, RunState] = {}
        last = model.cfg.n_layers - 1
        for (layer, _component), indices in tqdm(chunks, desc="patching (fast)", disable=not progress):
            k = len(indices)
            if k not in states:
                states[k] = repeat_run_state(state, k)
            chunk_specs = [specs[i] for i in indices]
            name = chunk_specs[0].hook_name
            finals = final.repeat(k)
            with model.hooks(fwd_hooks=[(name, patch_hook(chunk_specs, cache[name]))]):
                if layer < last and not block_has_hooks(model.blocks[last]):
                    # all blocks but the last for every position, the last one for the final position only
                    resid = model.run_blocks(resids[layer].repeat(k, 1, 1), states[k], layer, last)
                    resid = last_block_at_final(model, resid, states[k], finals)[:, None]
                    finals = torch.zeros_like(finals)
                else:
                    resid = model.run_blocks(resids[layer].repeat(k, 1, 1), states[k], layer, None)
            logits = final_logits(model, resid, finals).view(k, n, -1)
            for j, i in enumerate(indices):
                out[i] = logits[j]
    baseline = Baseline(clean_logits, corrupt_logits, batch.clean_tokens, batch.corrupt_tokens)
    return torch.stack(out) if out else clean_logits.new_zeros(0, *clean_logits.shape), baseline


def run_specs(model: HookedVLM, batch: PairBatch, specs: Sequence[PatchSpec], method: str = "fast",
              max_batch: int = 64, progress: bool = False):
    """Dispatch to `run_fast` or `run_naive`."""
    if method == "fast":
        return run_fast(model, batch, specs, max_batch=max_batch, progress=progress)
    if method == "naive":
        return run_naive(model, batch, specs, progress=progress)
    raise ValueError(f"unknown method {method!r}: use 'fast' or 'naive'")

"""The fast exact path for patch conditions: same logits as the naive loop, far less work.

- The vision tower runs once per batch (clean and corrupt), not once per condition.
- The clean run caches the residual entering every layer (and every layer's keys / values);
  a condition at layer l resumes from it: layers before l are not rerun.
- Positions before the first one a condition changes are untouched at every layer (causal
  attention), so the run covers only the suffix from there, reading the clean keys / values of
  the prefix as a KV cache (a "final"-region patch recomputes one position per layer).
- Several conditions run in one forward, as copies of the batch stacked along the batch
  dimension (`repeat_run_state`), each copy patching its own cell.
- The last block runs for the final position only (`final_block`): only its logits are read.
- A model with linear-attention layers (Qwen3.5's Gated DeltaNet) always runs whole rows: a suffix
  run would need each such layer's recurrent state at the suffix start, which the clean run does
  not keep. Its last block runs in full too when it is not plain softmax attention.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
from jaxtyping import Float, Int
from torch import Tensor
from tqdm.auto import tqdm

from vlens.core.components.attention import AttentionMasks, KVCache
from vlens.core.final_block import block_has_hooks, last_block_at, supports_last_block_at
from vlens.core.hooks import act_name
from vlens.core.runtime import RunState, build_masks
from vlens.parallel.options import SweepOptions, fold_legacy
from vlens.patching.conditions import PatchSpec, corrupt_activations, patch_hook, readout_logits
from vlens.patching.metrics import Baseline, final_baseline
from vlens.patching.pairs import PairBatch
from vlens.utils.validation import check_count

if TYPE_CHECKING:
    from vlens.core.model import HookedVLM


def repeat_run_state(state: RunState, k: int) -> RunState:
    """The run state of `k` copies of the batch stacked along the batch dimension (copy-major)."""
    if k == 1:
        return state

    def rep(t: Tensor, dim: int = 0) -> Tensor:
        sizes = [1] * t.ndim
        sizes[dim] = k
        return t.repeat(*sizes)

    def rep_optional(t: Tensor | None) -> Tensor | None:
        return None if t is None else rep(t)

    masks = AttentionMasks(sdpa=rep_optional(state.masks.sdpa), allowed=rep(state.masks.allowed),
                           dtype=state.masks.dtype, blocks=rep_optional(state.masks.blocks))
    position_ids = state.position_ids
    position_ids = rep(position_ids, 1 if position_ids.ndim == 3 else 0)
    # DeepStack features are flattened over image tokens in row order: copy-major repeat keeps that order.
    deepstack = {layer: (rep(mask), rep(feats)) for layer, (mask, feats) in state.deepstack.items()}
    return RunState(resid=rep(state.resid), cos=rep(state.cos), sin=rep(state.sin), masks=masks,
                    position_ids=position_ids, rope_deltas=rep_optional(state.rope_deltas), deepstack=deepstack, kv_cache=None)


def suffix_state(state: RunState, attention_mask: Tensor, start: int, prefix_kv: dict[int, tuple[Tensor, Tensor]],
                 n_layers: int) -> RunState:
    """A state that runs positions [start, pos) with the prefix's keys / values as a KV cache.

    attention_mask: [batch, pos] of the (repeated) batch; prefix_kv: layer -> (rotated keys,
    values) [batch, start, n_kv_heads, d_head] for every layer that will run.
    """
    if start == 0:
        return state
    batch, pos = attention_mask.shape
    masks = build_masks(attention_mask, batch, pos - start, start, state.masks.dtype, state.cos.device,
                        blocks=state.masks.blocks)
    cache = KVCache(n_layers)
    for layer, (k, v) in prefix_kv.items():
        cache.keys[layer], cache.values[layer] = k, v
    deepstack = {}
    for layer, (mask, feats) in state.deepstack.items():
        keep = mask.nonzero()[:, 1] >= start  # features are in row-major order of the image positions
        deepstack[layer] = (mask[:, start:], feats[keep])
    return RunState(resid=state.resid[:, start:], cos=state.cos[:, start:], sin=state.sin[:, start:], masks=masks,
                    position_ids=state.position_ids[..., start:], rope_deltas=state.rope_deltas,
                    deepstack=deepstack, kv_cache=cache)


def _clean_run(model: HookedVLM, state: RunState, names: set[str]):
    """Clean residuals entering each layer (+ the final one), each layer's rotated keys / values, and
    the clean activations at `names`."""
    n_layers = model.cfg.n_layers
    store: dict[str, Tensor] = {}

    def keep(act: Tensor, hook) -> None:
        store[hook.name] = act

    softmax = [layer for layer in range(n_layers) if not model.cfg.is_linear_attention(layer)]
    kv_names = [act_name(kind, layer) for layer in softmax for kind in ("rot_k", "v")]
    with model.hooks(fwd_hooks=[(name, keep) for name in sorted(set(kv_names) | names)]):
        resids = [state.resid]
        for layer in range(n_layers):
            resids.append(model.run_blocks(resids[-1], state, layer, layer + 1))
    kv = [(store[act_name("rot_k", layer)], store[act_name("v", layer)]) if layer in softmax else None
          for layer in range(n_layers)]
    return resids, kv, {name: store[name] for name in names}


def _first_change(spec: PatchSpec, differs: Tensor, last: int) -> int:
    """First column the patch changes (the final column if it changes nothing)."""
    if differs.ndim == 3:  # per-head activation
        differs = differs.any(-1) if spec.head is None else differs[..., spec.head]
    changed = (spec.positions.to(differs.device) & differs).any(0).nonzero()
    return int(changed[0]) if len(changed) else last


def count_chunks(specs: Sequence[PatchSpec], n_pairs: int, max_batch: int = 64) -> int:
    """How many forwards `FastPlan` splits `specs` into (known before running anything)."""
    check_count(max_batch, "max_batch")
    sizes: dict[tuple[int, str], int] = defaultdict(int)
    for spec in specs:
        sizes[(spec.layer, spec.component)] += 1
    per_chunk = max(1, max_batch // n_pairs)
    return sum(-(-size // per_chunk) for size in sizes.values())


class FastPlan:
    """The shared part of a fast sweep over one pair batch, and its forwards one chunk at a time.

    Building it runs the corrupt and the clean batch once (activations, residuals, keys /
    values) and splits the conditions into `chunks` (spec indices run in one forward, at most
    `max_batch` rows, grouped by layer, chunk mates sharing long unchanged prefixes). Every
    chunk is independent: `run_chunk(c)` gives the same numbers whichever process runs it.
    """

    def __init__(self, model: HookedVLM, batch: PairBatch, specs: Sequence[PatchSpec], max_batch: int = 64,
                 readout: Int[Tensor, "n_pairs n_readout"] | None = None,
                 cache_device: torch.device | str | None = None):
        self.model, self.batch, self.specs = model, batch, list(specs)
        n = batch.n_pairs
        names = {s.hook_name for s in self.specs}
        self.readout = batch.readout_positions() if readout is None else readout
        self.corrupt_logits, self.cache = corrupt_activations(model, batch, names, self.readout, cache_device)
        self.n_layers = model.cfg.n_layers
        with torch.no_grad():
            self.state = model.start_run(batch.clean)
            resids, clean_kv, clean_acts = _clean_run(model, self.state, names)
            self.clean_logits = readout_logits(model, resids[-1], self.readout)
        # each layer's input and keys / values, kept on cache_device; run_chunk returns them to their devices
        self.resid_devices = [r.device for r in resids]
        # (a linear-attention layer of a hybrid decoder has no keys / values: None)
        self.kv_devices = [None if kv is None else (kv[0].device, kv[1].device) for kv in clean_kv]
        self.resids = [r if cache_device is None else r.to(cache_device) for r in resids]
        self.clean_kv = [kv if cache_device is None or kv is None else (kv[0].to(cache_device), kv[1].to(cache_device))
                         for kv in clean_kv]
        del resids, clean_kv
        with torch.no_grad():
            # where the corrupt activation differs from the clean one: [n, pos] or [n, pos, heads]
            differs = {}
            for name in names:
                diff = self.cache[name].to(clean_acts[name].device) != clean_acts[name]
                differs[name] = diff.any(-1).cpu()
        first_read = int(self.readout.min())  # nothing before the first change reaches a readout position
        # a change is read by positions before it where attention is bidirectional (Gemma 3's image blocks)
        reach = self.state.masks.first_affected
        self.starts = [reach(min(_first_change(s, differs[s.hook_name], first_read), first_read)) for s in self.specs]
        if model.cfg.linear_attention_layers:
            # a suffix run would need each linear-attention layer's recurrent state at its start: run whole rows
            self.starts = [0] * len(self.specs)
        groups: dict[tuple[int, str], list[int]] = defaultdict(list)
        for index in sorted(range(len(self.specs)), key=lambda i: self.starts[i]):  # chunk mates share prefixes
            groups[(self.specs[index].layer, self.specs[index].component)].append(index)
        per_chunk = max(1, max_batch // n)
        self.chunks = [idx[i:i + per_chunk] for idx in groups.values() for i in range(0, len(idx), per_chunk)]
        self._repeated: dict[int, tuple[RunState, Tensor]] = {}
        last_block = model.blocks[self.n_layers - 1]
        self._last_block_free = not block_has_hooks(last_block) and supports_last_block_at(last_block)

    def run_chunk(self, chunk: int) -> tuple[list[int], Float[Tensor, "k n_pairs n_readout d_vocab"]]:
        """(spec indices, their patched readout logits [k, n_pairs, n_readout, d_vocab]) for chunk `chunk`."""
        model, specs, indices = self.model, self.specs, self.chunks[chunk]
        n, last = self.batch.n_pairs, self.n_layers - 1
        k, layer, name = len(indices), specs[indices[0]].layer, specs[indices[0]].hook_name
        start = min(self.starts[i] for i in indices)
        with torch.no_grad():
            if k not in self._repeated:
                mask = self.batch.clean.attention_mask.to(self.state.cos.device).repeat(k, 1)
                self._repeated[k] = (repeat_run_state(self.state, k), mask)
            full_state, attention_mask = self._repeated[k]
            prefix = {}
            for l_, (kv, devices) in enumerate(zip(self.clean_kv, self.kv_devices, strict=True)):
                if l_ >= layer and kv is not None and devices is not None:  # (the prefix's keys / values)
                    prefix[l_] = (kv[0][:, :start].to(devices[0]).repeat(k, 1, 1, 1),
                                  kv[1][:, :start].to(devices[1]).repeat(k, 1, 1, 1))
            run_state = suffix_state(full_state, attention_mask, start, prefix, self.n_layers)
            resid = self.resids[layer][:, start:].to(self.resid_devices[layer]).repeat(k, 1, 1)
            reads = self.readout.to(resid.device).repeat(k, 1) - start
            chunk_specs = [specs[i] for i in indices]
            with model.hooks(fwd_hooks=[(name, patch_hook(chunk_specs, self.cache[name], start))]):
                if layer < last and self._last_block_free:
                    resid = model.run_blocks(resid, run_state, layer, last)
                    resid = last_block_at(model, resid, run_state, reads)
                    reads = torch.arange(reads.shape[1], device=reads.device).expand_as(reads)
                else:
                    resid = model.run_blocks(resid, run_state, layer, None)
            return indices, readout_logits(model, resid, reads).view(k, n, *reads.shape[1:], -1)


def run_fast(model: HookedVLM, batch: PairBatch, specs: Sequence[PatchSpec], options: SweepOptions | None = None,
             **legacy: Any) -> tuple[Float[Tensor, "n_specs n_pairs d_vocab"], Baseline]:
    """Same result as `run_naive` (within float noise); see the module docstring.

    options: `max_batch` (most rows, conditions x pairs, in one forward; conditions are batched
        in chunks), `progress`, `cache_device` (`vlens.SweepOptions`).
    Returns (patched final logits [n_specs, n_pairs, d_vocab], Baseline).
    """
    options = fold_legacy(options, legacy, "run_fast", ("max_batch", "progress"))
    plan = FastPlan(model, batch, specs, options.max_batch, cache_device=options.cache_device)
    out: dict[int, Tensor] = {}
    for chunk in tqdm(range(len(plan.chunks)), desc="patching (fast)", disable=not options.progress):
        indices, logits = plan.run_chunk(chunk)
        for j, i in enumerate(indices):
            out[i] = logits[j, :, 0]
    baseline = final_baseline(batch, plan.clean_logits, plan.corrupt_logits)
    return torch.stack([out[i] for i in range(len(specs))]) if out else baseline.clean_logits.new_zeros(0, *baseline.clean_logits.shape), baseline


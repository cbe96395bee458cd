"""Patch conditions and the patching hook, shared by the naive loop and the fast path.

A condition (`PatchSpec`) writes the corrupt run's activation at one hook point, at some
positions (and for `hook_z` one head), into the clean run. Its semantics are exactly
``model.run_with_hooks(clean_inputs, fwd_hooks=[(name, hook)])`` where the hook sets
``act[row, pos(, head)] = corrupt_cache[name][row, pos(, head)]``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from jaxtyping import Float, Int
from torch import Tensor

from vlens.core.final_block import gather_positions
from vlens.core.hooks import act_name
from vlens.patching.pairs import PairBatch
from vlens.utils.errors import UserInputError

if TYPE_CHECKING:
    from vlens.core.model import HookedVLM

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
    """Refuse a component name patching does not know (`COMPONENTS`)."""
    if component not in COMPONENTS:
        raise UserInputError(f"unknown component {component!r}: patch one of {COMPONENTS}")


def _patch_mask(specs: Sequence[PatchSpec], act: Tensor, start: int = 0) -> Tensor:
    """bool mask broadcastable to `act` ([k*n, pos, d] or [k*n, pos, H, d]) for k stacked specs."""
    masks = []
    for spec in specs:
        positions = spec.positions[:, start:].to(act.device)
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


def patch_hook(specs: Sequence[PatchSpec], corrupt_act: Tensor, start: int = 0):
    """A forward hook writing `corrupt_act` ([n, pos, ...]) into each stacked copy where its spec says.

    start: the hooked activation holds positions [start, pos) only (the fast path's suffix runs).
    """
    source_all = corrupt_act[:, start:]

    def hook(act: Tensor, hook=None) -> Tensor:
        mask = _patch_mask(specs, act, start)
        source = source_all.to(act.device, act.dtype).repeat(len(specs), *([1] * (act.ndim - 1)))
        return torch.where(mask, source, act)

    return hook


def final_logits(model: HookedVLM, resid: Float[Tensor, "batch pos d_model"], final: Tensor) -> Float[Tensor, "batch d_vocab"]:
    """Logits at each row's final position from the last residual stream."""
    rows = torch.arange(resid.shape[0], device=resid.device)
    return model.finish(resid[rows, final.to(resid.device)][:, None, :])[:, 0]


def readout_logits(model: HookedVLM, resid: Float[Tensor, "batch pos d_model"],
                   positions: Int[Tensor, "batch n_readout"]) -> Float[Tensor, "batch n_readout d_vocab"]:
    """Logits at each row's readout positions from the last residual stream."""
    return model.finish(gather_positions(resid, positions))


def correct_pairs(model: HookedVLM, batch: PairBatch, what: str = "correct_pairs") -> PairBatch:
    """The pairs whose clean and corrupt runs both predict their own answer token at the final
    position (the usual filter before patching: a flip means something only when both runs were right).

    what: how the caller is named in the error when no pair is left (e.g. the flag "--only-correct").
    """
    with torch.no_grad():
        clean = final_logits(model, model(batch.clean, stop_at_layer=model.cfg.n_layers), batch.final)
        corrupt, _ = corrupt_activations(model, batch, set())
    keep = (clean.argmax(-1).cpu() == batch.clean_tokens) & (corrupt.argmax(-1).cpu() == batch.corrupt_tokens)
    rows = keep.nonzero().flatten().tolist()
    if not rows:
        raise UserInputError(f"{what}: the model answers no pair correctly in both roles")
    return batch.select(rows)


def corrupt_activations(model: HookedVLM, batch: PairBatch, names: set[str],
                        readout: Int[Tensor, "n_pairs n_readout"] | None = None,
                        cache_device: torch.device | str | None = None):
    """Corrupt-run logits at the readout positions [n, n_readout, d_vocab] (default: the final
    position, [n, d_vocab]) and the cached activations at `names` (on `cache_device`, default
    where they were computed)."""
    where: dict[str, Any] = {} if cache_device is None else {"device": cache_device}
    with torch.no_grad():
        logits, cache = model.run_with_cache(batch.corrupt, names_filter=lambda n: n in names, **where)
    if readout is not None:
        return gather_positions(logits, readout), cache
    rows = torch.arange(batch.n_pairs)
    return logits[rows, batch.corrupt.token_regions.final.to(logits.device)], cache

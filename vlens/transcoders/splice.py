"""Replacing every covered MLP's output by its transcoder's reconstruction inside a forward.

While `splice_transcoders` lasts, each covered layer l gets two hook points of its own:

    blocks.{l}.hook_tc_acts    [batch, pos, d_tc]     the transcoder's features (edit them here)
    blocks.{l}.hook_tc_error   [batch, pos, d_model]  the error term added to the reconstruction

and ``blocks.{l}.hook_mlp_out`` returns ``decode(acts) + error``. The MLP input is what the MLP
itself reads (``block.mlp_input`` at ``block.mlp_input_hook``: ln2 of ``hook_resid_mid``; ln1 of ``hook_resid_pre``
in a parallel block). `error` chooses the error:

- "none": no error term (the transcoders alone: what loss recovered measures);
- "live": ``mlp_out - decode(unedited acts)`` of this very forward, without gradient: the real model
  with the features spliced in (only feature edits change anything);
- a dict {layer: [batch, pos, d_model]}: fixed errors (the replacement model's, from the prompt's run).

Everything added is removed when the context ends, also on error.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from vlens.core.hooks import HookPoint, new_context_level
from vlens.core.model import HookedVLM
from vlens.transcoders.model import Transcoders
from vlens.utils.errors import UserInputError

ErrorMode = str | Mapping[int, Tensor]


@dataclass
class SpliceState:
    """What one spliced forward has computed so far (per covered layer index)."""

    inputs: dict[int, Tensor] = field(default_factory=dict)
    clean: dict[int, Tensor] = field(default_factory=dict)
    acts: dict[int, Tensor] = field(default_factory=dict)


def check_model(model: HookedVLM, tc: Transcoders) -> None:
    if tc.cfg.d_model != model.cfg.d_model:
        raise UserInputError(f"the transcoders read d_model={tc.cfg.d_model} but the model's is {model.cfg.d_model}.")
    if max(tc.cfg.layers) >= model.cfg.n_layers:
        raise UserInputError(f"the transcoders cover layers {list(tc.cfg.layers)} but the model has "
                             f"{model.cfg.n_layers} layers.")


@contextmanager
def splice_transcoders(model: HookedVLM, tc: Transcoders, error: ErrorMode = "none") -> Iterator[SpliceState]:
    """Splice `tc` into every forward inside the block (see the module doc); yields the `SpliceState`."""
    check_model(model, tc)
    if isinstance(error, str) and error not in ("none", "live"):
        raise UserInputError(f"error={error!r}: use 'none', 'live' or a dict of fixed errors per layer.")
    if isinstance(error, Mapping):
        missing = set(tc.cfg.layers) - set(error)
        if missing:
            raise UserInputError(f"fixed errors lack layers {sorted(missing)}.")
    state = SpliceState()
    points: dict[str, HookPoint] = {}
    for layer in tc.cfg.layers:
        for suffix in ("hook_tc_acts", "hook_tc_error"):
            point = HookPoint()
            point.name = f"blocks.{layer}.{suffix}"
            points[point.name] = point

    def read_input(i: int, layer: int):
        def hook(resid: Tensor, hook: Any = None) -> None:
            x = model.blocks[layer].mlp_input(resid)  # ln2(resid_mid); ln1(resid_pre) in a parallel block
            clean = tc.encode(i, x)
            state.inputs[i], state.clean[i] = x, clean
            state.acts[i] = points[f"blocks.{layer}.hook_tc_acts"](clean)
        return hook

    def write_output(i: int, layer: int):
        def hook(mlp_out: Tensor, hook: Any = None) -> Tensor:
            acts = [state.acts.get(k) for k in range(tc.cfg.n_layers)]
            recons = tc.decode(i, acts, state.inputs[i])
            if isinstance(error, Mapping):
                err = error[layer].to(recons)
            elif error == "live":
                with torch.no_grad():
                    clean = [state.clean.get(k) for k in range(tc.cfg.n_layers)]
                    same = all(state.acts.get(k) is state.clean.get(k) for k in tc.writers(i))
                    err = (mlp_out.to(recons.dtype) - (recons if same else tc.decode(i, clean, state.inputs[i]))).detach()
            else:
                err = torch.zeros_like(recons)
            out = recons + points[f"blocks.{layer}.hook_tc_error"](err)
            return out.to(mlp_out.dtype)
        return hook

    level = new_context_level()
    added: list[str] = []
    try:
        for name, point in points.items():
            if name in model.hook_dict:
                raise UserInputError(f"{name} is already a hook point: transcoders are already spliced into this model.")
            model.hook_dict[name] = point
            model.mod_dict[name] = point
            added.append(name)
        for i, layer in enumerate(tc.cfg.layers):
            model.add_hook(f"blocks.{layer}.{model.blocks[layer].mlp_input_hook}", read_input(i, layer), dir="fwd",
                           level=level)
            model.add_hook(f"blocks.{layer}.hook_mlp_out", write_output(i, layer), dir="fwd", level=level)
        yield state
    finally:
        model.reset_hooks(including_permanent=False, level=level)
        for name in added:
            removed = model.hook_dict.pop(name)
            model.mod_dict.pop(name, None)
            removed.remove_hooks("both", including_permanent=True)

"""Head ablation as `hook_z` hooks: mean, zero and resample replacement of chosen heads.

A replaced head's output `z[:, pos, head, :]` is overwritten at every real (non-padding)
position; padding positions keep their values (no real token ever attends to them).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import torch
from jaxtyping import Bool, Float
from torch import Tensor

from vlens.ablation.reference import ReferenceActivations
from vlens.core.hooks import act_name
from vlens.core.inputs import VLMInputs
from vlens.utils.errors import UserInputError

if TYPE_CHECKING:
    from vlens.core.model import HookedVLM


METHODS: tuple[str, ...] = ("mean", "zero", "resample")
Hook = Callable[[Tensor, object], Tensor]


def check_method(method: str, reference: ReferenceActivations | None) -> str:
    if method not in METHODS:
        raise UserInputError(f"unknown ablation method {method!r}: use one of {METHODS}")
    if method != "zero" and reference is None:
        raise UserInputError(f"{method} ablation needs reference activations: "
                         "reference = collect_reference(model, reference_set)")
    return method


def replacement_values(
    model: HookedVLM,
    method: str,
    layer: int,
    inputs: VLMInputs,
    reference: ReferenceActivations | None = None,
    partners: Sequence[int] | None = None,
    slot_ids: Tensor | None = None,
) -> Float[Tensor, "batch pos n_heads d_head"]:
    """What every head of `layer` is replaced by on `inputs` (all heads; hooks pick theirs).

    partners: for "resample", the reference example of each row (see `resample_partners`).
    """
    check_method(method, reference)
    if method == "zero":
        cfg = model.cfg
        return torch.zeros(*inputs.input_ids.shape, cfg.heads_at(layer), cfg.d_head_at(layer), dtype=cfg.dtype,
                           device=model.unembed.device)
    if reference is None:
        raise UserInputError(f"{method} ablation needs reference activations")
    if method == "mean":
        return reference.mean_values(layer, inputs, slot_ids)
    if partners is None:
        raise UserInputError("resample ablation needs partners: one reference example index per row")
    return reference.resample_values(layer, inputs, partners, slot_ids)


def stacked_head_hook(
    heads: Sequence[int],
    values: Float[Tensor, "batch pos n_heads d_head"],
    real: Bool[Tensor, "batch pos"],
) -> Hook:
    """A `hook_z` hook for a batch stacked len(heads) times: copy g (rows g*batch .. (g+1)*batch)
    has head heads[g] replaced by `values`. With one head and no stacking, a plain ablation."""
    batch = values.shape[0]

    def hook(z: Tensor, hook) -> Tensor:
        if z.shape[0] != batch * len(heads):
            raise RuntimeError(f"hook_z batch {z.shape[0]} != {len(heads)} copies x {batch} rows")
        z = z.clone()
        mask = real.to(z.device)[..., None]
        for g, head in enumerate(heads):
            rows = slice(g * batch, (g + 1) * batch)
            z[rows, :, head] = torch.where(mask, values[:, :, head].to(z.device, z.dtype), z[rows, :, head])
        return z

    return hook


def ablation_hooks(
    model: HookedVLM,
    inputs: VLMInputs,
    heads: Sequence[tuple[int, int]],
    method: str = "mean",
    reference: ReferenceActivations | None = None,
    partners: Sequence[int] | None = None,
) -> list[tuple[str, Hook]]:
    """Hooks that ablate all `heads` ((layer, head) pairs) together on `inputs`:

        logits = model.run_with_hooks(inputs, fwd_hooks=ablation_hooks(model, inputs, [(1, 3)], "mean", ref))
    """
    by_layer: dict[int, list[int]] = defaultdict(list)
    for layer, head in heads:
        if not (0 <= layer < model.cfg.n_layers and 0 <= head < model.cfg.heads_at(layer)):
            where = f"layer {layer}'s {model.cfg.heads_at(layer)} heads" if 0 <= layer < model.cfg.n_layers else \
                f"the model's {model.cfg.n_layers} layers"
            raise UserInputError(f"head ({layer}, {head}) is outside {where}")
        by_layer[layer].append(head)
    real = inputs.attention_mask.bool()
    hooks = []
    for layer, layer_heads in sorted(by_layer.items()):
        values = replacement_values(model, method, layer, inputs, reference, partners)
        per_head = [stacked_head_hook([h], values, real) for h in layer_heads]
        hooks += [(act_name("z", layer), fn) for fn in per_head]
    return hooks

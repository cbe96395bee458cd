"""Edits and attributions on SAE features: ablation, patching from another run, and attribution as
gradient x activation.

All splice the SAEs with the error term, so that the unedited model is the original one and
only the feature edit changes anything. `feature_attribution` is the first-order estimate of
`ablate_features`: zeroing feature f at position p changes the metric by about
``-attribution[p, f]`` (exactly, where the metric is linear in the features).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor

from vlens.core.model import HookedVLM
from vlens.core.splicing import Dictionary, Positions
from vlens.utils.errors import UserInputError

Metric = Callable[[Tensor], Tensor]  # logits [batch, pos, d_vocab] -> a scalar (or [batch], summed)


def acts_hook(hook_name: str) -> str:
    """The hook point of an SAE's feature activations while it is spliced at `hook_name`."""
    return f"{hook_name}.hook_sae_acts_post"


def ablate_features(model: HookedVLM, inputs: Any, saes: Mapping[str, Dictionary],
                    features: Mapping[str, Sequence[int]], positions: Positions = "all",
                    value: float = 0.0) -> Float[Tensor, "batch pos d_vocab"]:
    """Logits with the listed features of each SAE set to `value` (0: ablated) at `positions`.

    features: {hook_name: [feature indices]}, each hook one of `saes`.
    """
    unknown = set(features) - set(saes)
    if unknown:
        raise UserInputError(f"features name hooks without an SAE: {sorted(unknown)} (SAEs at {sorted(saes)}).")

    def setter(indices: list[int]):
        def hook(acts: Tensor, hook: Any = None) -> Tensor:
            acts = acts.clone()  # unspliced positions are dropped after decoding, so setting them is harmless
            acts[..., indices] = value
            return acts
        return hook

    run_inputs = model.coerce_inputs(inputs)
    with model.saes(saes, positions=positions, use_error_term=True, inputs=run_inputs):
        hooks: list[Any] = [(acts_hook(name), setter(list(indices))) for name, indices in features.items()]
        with torch.no_grad():
            return model.run_with_hooks(run_inputs, fwd_hooks=hooks)


def patch_features(model: HookedVLM, clean: Any, corrupt: Any, saes: Mapping[str, Dictionary],
                   features: Mapping[str, Sequence[int]] | None = None, positions: Positions = "all"
                   ) -> Float[Tensor, "batch pos d_vocab"]:
    """Logits of the clean run with the listed features (None: all of each SAE) taken from the corrupt run.

    Both runs splice the SAEs with the error term (the clean run keeps its own error), at the same
    positions, so clean and corrupt inputs must have the same shape (`vlens.patching` pairs do).
    """
    clean_inputs, corrupt_inputs = model.coerce_inputs(clean), model.coerce_inputs(corrupt)
    if clean_inputs.input_ids.shape != corrupt_inputs.input_ids.shape:
        raise UserInputError(f"clean and corrupt inputs differ in shape ({tuple(clean_inputs.input_ids.shape)} vs "
                             f"{tuple(corrupt_inputs.input_ids.shape)}): patch between inputs of one shape.")
    chosen = {name: None for name in saes} if features is None else dict(features)
    unknown = set(chosen) - set(saes)
    if unknown:
        raise UserInputError(f"features name hooks without an SAE: {sorted(unknown)} (SAEs at {sorted(saes)}).")
    with torch.no_grad():
        _, cache = model.run_with_cache(corrupt_inputs, saes=saes, positions=positions, use_error_term=True,
                                        names_filter=[acts_hook(name) for name in chosen])
    donors = {name: cache[acts_hook(name)] for name in chosen}

    def patcher(name: str, indices: Sequence[int] | None):
        def hook(acts: Tensor, hook: Any = None) -> Tensor:
            acts = acts.clone()
            if indices is None:
                acts[...] = donors[name]
            else:
                acts[..., list(indices)] = donors[name][..., list(indices)]
            return acts
        return hook

    with model.saes(saes, positions=positions, use_error_term=True, inputs=clean_inputs), torch.no_grad():
        hooks: list[Any] = [(acts_hook(name), patcher(name, indices)) for name, indices in chosen.items()]
        return model.run_with_hooks(clean_inputs, fwd_hooks=hooks)


def feature_attribution(model: HookedVLM, inputs: Any, saes: Mapping[str, Dictionary], metric: Metric,
                        positions: Positions = "all") -> dict[str, Float[Tensor, "batch pos d_sae"]]:
    """Per SAE, gradient x activation of every feature at every position, of ``metric(logits)``.

    The metric's value is summed over a batch; the SAEs are spliced with the error term.
    """
    run_inputs = model.coerce_inputs(inputs)
    seen: dict[str, Tensor] = {}

    def keep(name: str):
        def hook(acts: Tensor, hook: Any = None) -> Tensor:
            acts.retain_grad()
            seen[name] = acts
            return acts
        return hook

    with model.saes(saes, positions=positions, use_error_term=True, inputs=run_inputs), torch.enable_grad():
        hooks: list[Any] = [(acts_hook(name), keep(name)) for name in saes]
        logits = model.run_with_hooks(run_inputs, fwd_hooks=hooks)
        value = metric(logits).sum()
        value.backward()
    out = {}
    for name, acts in seen.items():
        grad = acts.grad if acts.grad is not None else torch.zeros_like(acts)
        out[name] = (grad * acts).detach()
    return out

"""Edits and attributions on SAE features: ablation, and attribution as gradient x activation.

Both splice the SAEs with the error term, so that the unedited model is the original one and
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

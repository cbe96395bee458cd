"""Where a steering direction comes from: a difference of means, an SAE / transcoder feature, a probe."""

from __future__ import annotations

from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor

from vlens.utils.errors import UserInputError


def region_mean(model: Any, inputs: Any, hook: str, region: str = "final") -> Float[Tensor, "d_model"]:
    """The mean of `hook`'s activation [batch, pos, d] over every row's `region` positions ("final",
    "image", "text", "all": `TokenRegions.region`), in fp32."""
    _, cache = model.run_with_cache(inputs, names_filter=[hook])
    acts = cache[hook]
    if acts.ndim != 3:
        raise UserInputError(f"mean_difference reads a [batch, pos, d] hook; {hook} is {tuple(acts.shape)}: use a "
                             "residual-stream hook such as blocks.{l}.hook_resid_post.")
    rows = [acts[row, inputs.regions.region(region, row).to(acts.device)] for row in range(inputs.batch_size)]
    picked = torch.cat(rows)
    if picked.shape[0] == 0:
        raise UserInputError(f"mean_difference: the inputs have no {region!r} positions; choose another region.")
    return picked.float().mean(0)


def mean_difference(model: Any, positive: Any, negative: Any, hook: str,
                    region: str = "final") -> Float[Tensor, "d_model"]:
    """mean(`hook` at `region` over the positive prompts) - mean(over the negative ones) [d_model], fp32.

    positive, negative: `VLMInputs` (e.g. `model.prepare(images=..., prompts=...)`), any batch sizes.
    Unnormalised: strength 1 moves an activation by the difference between the two sets' means.
    """
    return region_mean(model, positive, hook, region) - region_mean(model, negative, hook, region)


def sae_direction(sae: Any, feature: int) -> Float[Tensor, "d_model"]:
    """Feature `feature`'s decoder row ``W_dec[feature]`` [d_in] of an SAE or transcoder (SAELens's shapes:
    ``W_dec [d_sae, d_in]``), as it is written into the stream (strength 1 = the feature at activation 1)."""
    weight = getattr(sae, "W_dec", None)
    if not isinstance(weight, Tensor) or weight.ndim != 2:
        raise UserInputError(f"sae_direction needs an SAE / transcoder with W_dec [d_sae, d_in]; got a "
                             f"{type(sae).__name__}.")
    if isinstance(feature, bool) or not 0 <= int(feature) < weight.shape[0]:
        raise UserInputError(f"sae_direction: feature {feature} is not in [0, {weight.shape[0]}).")
    return weight[int(feature)].detach().float().clone()


def transcoder_direction(transcoders: Any, layer: int, feature: int) -> Float[Tensor, "d_model"]:
    """Feature `feature` of the per-layer transcoder at decoder layer `layer`: its decoder row [d_model], what
    it writes into that layer's ``hook_mlp_out`` (strength 1 = the feature at activation 1).

    transcoders: a `vlens.transcoders.Transcoders` set of kind "plt" or "skip". A cross-layer transcoder's
    feature writes every later layer with its own vector, which one added direction cannot stand for.
    """
    cfg = transcoders.cfg
    if cfg.kind == "clt":
        raise UserInputError("transcoder_direction: a cross-layer transcoder's feature writes each later layer with "
                             "its own vector; steer with one of its decoder rows as a direction instead.")
    if layer not in cfg.layers:
        raise UserInputError(f"transcoder_direction: layer {layer} is not covered; the set covers layers "
                             f"{', '.join(map(str, cfg.layers))}.")
    i = list(cfg.layers).index(layer)
    if isinstance(feature, bool) or not 0 <= int(feature) < cfg.d_tc:
        raise UserInputError(f"transcoder_direction: feature {feature} is not in [0, {cfg.d_tc}).")
    return transcoders.decoder(i, i)[int(feature)].detach().float().clone()


def probe_direction(weight: Tensor, label: int | None = None) -> Float[Tensor, "d_model"]:
    """A linear probe's direction, unit length (a probe's scale is arbitrary): `weight` [d] or [n_classes, d]
    (row `label`; for two classes without a label, row 1 - row 0, the direction of class 1)."""
    if not isinstance(weight, Tensor) or weight.ndim not in (1, 2):
        raise UserInputError("probe_direction takes the probe's weight, a tensor [d] or [n_classes, d].")
    w = weight.detach().float()
    if w.ndim == 2:
        if label is not None:
            if not 0 <= label < w.shape[0]:
                raise UserInputError(f"probe_direction: label {label} is not in [0, {w.shape[0]}).")
            w = w[label]
        elif w.shape[0] == 2:
            w = w[1] - w[0]
        elif w.shape[0] == 1:
            w = w[0]
        else:
            raise UserInputError(f"probe_direction: a {w.shape[0]}-class probe; pass label= to choose its class.")
    norm = w.norm()
    if not bool(norm > 0):
        raise UserInputError("probe_direction: the probe's weight is zero; it has no direction.")
    return w / norm

"""Splicing dictionaries (sparse autoencoders) into the forward: `model.run_with_saes`, `model.saes(...)`.

At a spliced hook the activation ``x`` is replaced, at the chosen positions, by the SAE's
reconstruction ``decode(encode(x))`` (plus, with ``use_error_term``, the error
``x - decode(encode(x))`` computed without edits and without gradient, so that the spliced model
computes exactly what the unspliced one does until a feature is edited). Each spliced hook gets
hook points of its own while the splice lasts (SAELens's names):

    <hook>.hook_sae_input      [batch, pos, d_in]   what the SAE reads
    <hook>.hook_sae_acts_post  [batch, pos, d_sae]  feature activations (0 where not spliced): edit to ablate
    <hook>.hook_sae_recons     [batch, pos, d_in]   decode(acts)
    <hook>.hook_sae_error      [batch, pos, d_in]   the error term (only with use_error_term)
    <hook>.hook_sae_output     [batch, pos, d_in]   what replaces the activation

so `run_with_cache`, `run_with_hooks` and `hooks` see them like any other hook. ``hook_z`` style
activations ``[batch, pos, heads, d_head]`` are flattened to ``d_in = heads * d_head``; activations
without a position axis (``vision.hook_image_embeds`` ``[n_tokens, d]``) are spliced on every row.
The splice and its hook points are removed when the call or the context ends, also on error.
Anything with ``encode`` / ``decode`` is a dictionary here (`vlens.sae` has SAELens-compatible ones).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any, Protocol

import torch
from jaxtyping import Bool
from torch import Tensor, nn

from vlens.core.hooks import HookPoint, new_context_level
from vlens.core.inputs import VLMInputs
from vlens.utils.errors import UserInputError

REGIONS = ("all", "image", "text", "final")
SAE_HOOKS = ("hook_sae_input", "hook_sae_acts_post", "hook_sae_recons", "hook_sae_error", "hook_sae_output")
Positions = str | Tensor  # a region name, or a bool mask [batch, pos]


class Dictionary(Protocol):
    """What splicing needs of an SAE."""

    def encode(self, x: Tensor) -> Tensor: ...

    def decode(self, acts: Tensor) -> Tensor: ...


def dictionary_dtype(sae: Any) -> torch.dtype | None:
    params = list(sae.parameters()) if isinstance(sae, nn.Module) else []
    return params[0].dtype if params else None


def dictionary_width(sae: Any) -> int | None:
    """The activation width a dictionary reads (`d_in`, its config's, or its encoder's rows); None when unknown."""
    width = getattr(sae, "d_in", None)
    if width is None:
        width = getattr(getattr(sae, "cfg", None), "d_in", None)
    if width is None and isinstance(getattr(sae, "W_enc", None), Tensor):
        width = sae.W_enc.shape[0]
    return int(width) if isinstance(width, int) else None


class SpliceSite(nn.Module):
    """The hook points of one spliced hook and the replacement it computes."""

    def __init__(self, hook_name: str, sae: Dictionary, mask: Tensor | None, decode_steps: bool,
                 use_error_term: bool):
        super().__init__()
        self.hook_name, self.sae, self.mask = hook_name, sae, mask
        self.decode_steps, self.use_error_term = decode_steps, use_error_term
        self.hook_sae_input, self.hook_sae_acts_post = HookPoint(), HookPoint()
        self.hook_sae_recons, self.hook_sae_error, self.hook_sae_output = HookPoint(), HookPoint(), HookPoint()
        for name, point in zip(SAE_HOOKS, self.hook_points(), strict=True):
            point.name = f"{hook_name}.{name}"

    def hook_points(self) -> list[HookPoint]:
        return [self.hook_sae_input, self.hook_sae_acts_post, self.hook_sae_recons, self.hook_sae_error,
                self.hook_sae_output]

    def points(self) -> dict[str, HookPoint]:
        return {point.name: point for point in self.hook_points() if point.name is not None}

    def position_mask(self, activation: Tensor) -> Tensor | None:
        """[batch, pos] bool of the positions to splice (None: every row of a position-less activation)."""
        if activation.ndim == 2:
            return None
        batch, pos = activation.shape[:2]
        if self.mask is None:
            return torch.ones(batch, pos, dtype=torch.bool, device=activation.device)
        if tuple(self.mask.shape) == (batch, pos):
            return self.mask.to(activation.device)
        if pos == 1 and self.mask.shape[0] == batch:  # a decoding step of generate: one new (text) token
            return torch.full((batch, 1), self.decode_steps, dtype=torch.bool, device=activation.device)
        raise UserInputError(f"SAE at {self.hook_name}: the positions are a [{', '.join(map(str, self.mask.shape))}] "
                             f"mask but the activation is [{batch}, {pos}, ...]: build the mask for these inputs.")

    def hook(self, activation: Tensor, hook: Any = None) -> Tensor:
        """The forward hook at the spliced hook point."""
        return self.splice(activation)

    def splice(self, activation: Tensor) -> Tensor:
        lead = activation.shape[:2] if activation.ndim >= 3 else activation.shape[:1]
        x = activation.reshape(*lead, -1)
        width = dictionary_width(self.sae)
        if width is not None and x.shape[-1] != width:
            # a dictionary trained on another model (or hook): its weights would not even multiply
            raise UserInputError(f"the SAE spliced at {self.hook_name} reads activations of width {width}, but this "
                                 f"model's {self.hook_name} has width {x.shape[-1]}: splice it on the model (and hook) "
                                 "it was trained on, or train an SAE on this one.")
        dtype = dictionary_dtype(self.sae) or x.dtype
        x = self.hook_sae_input(x.to(dtype))
        mask = self.position_mask(activation)
        keep = mask.unsqueeze(-1) if mask is not None else None
        clean = self.sae.encode(x)
        if keep is not None:
            clean = clean * keep.to(clean.dtype)
        acts = self.hook_sae_acts_post(clean)
        recons = self.hook_sae_recons(self.sae.decode(acts))
        out = recons
        if self.use_error_term:
            with torch.no_grad():
                clean_recons = recons if acts is clean else self.sae.decode(clean)
                error = (x - clean_recons).detach()
            out = recons + self.hook_sae_error(error)
        if keep is not None:
            out = torch.where(keep, out, x)
        out = self.hook_sae_output(out)
        return out.to(activation.dtype).reshape(activation.shape)


def resolve_positions(positions: Positions, inputs: VLMInputs | None, hook_name: str) -> tuple[Tensor | None, bool]:
    """(mask [batch, pos] or None for every position, whether decoding steps are spliced)."""
    if isinstance(positions, Tensor):
        if positions.dtype != torch.bool or positions.ndim != 2:
            raise UserInputError(f"positions for {hook_name}: a tensor must be a bool mask [batch, pos], got "
                                 f"{positions.dtype} of shape {tuple(positions.shape)}.")
        return positions, False
    if positions not in REGIONS:
        raise UserInputError(f"positions {positions!r}: use one of {', '.join(REGIONS)} or a bool mask [batch, pos].")
    if positions == "all":
        return None, True
    if inputs is None:
        raise UserInputError(f"positions={positions!r} needs the inputs the splice will see: pass inputs= "
                             "(model.saes(saes, positions, inputs=inputs)) or use run_with_saes(inputs, ...).")
    mask: Bool[Tensor, "batch pos"] = inputs.token_regions.mask(positions, inputs.seq_len)
    return mask.to(inputs.device), positions == "text"


class SpliceMixin:
    """`saes` (context manager), `run_with_saes`, `run_with_cache_with_saes` for `HookedVLM`."""

    @contextmanager
    def saes(self, saes: Mapping[str, Dictionary], positions: Positions = "all", use_error_term: bool = False,
             inputs: Any = None) -> Iterator[Any]:
        """Splice `saes` ({hook_name: sae}) into every forward inside the block.

        positions: "all" (every position and every token `generate` adds), "image", "text" (also the
            generated tokens), "final" (the last prompt position), or a bool mask [batch, pos]; every
            name but "all" needs `inputs` (the `VLMInputs` the forwards will run).
        use_error_term: add ``x - decode(encode(x))`` so that only feature edits change the output.
        """
        model: Any = self
        if not isinstance(saes, Mapping) or not saes:
            raise UserInputError("saes must be a non-empty mapping {hook_name: sae}.")
        run_inputs = model.coerce_inputs(inputs) if inputs is not None and not isinstance(inputs, VLMInputs) else inputs
        sites = []
        for hook_name, sae in saes.items():
            model.check_hook_name(hook_name)
            if not (callable(getattr(sae, "encode", None)) and callable(getattr(sae, "decode", None))):
                raise UserInputError(f"saes[{hook_name!r}] has no encode/decode: pass an SAE (vlens.sae).")
            mask, decode_steps = resolve_positions(positions, run_inputs, hook_name)
            sites.append(SpliceSite(hook_name, sae, mask, decode_steps, use_error_term))
        level = new_context_level()
        added: list[str] = []
        try:
            for site in sites:
                for name, point in site.points().items():
                    if name in model.hook_dict:
                        raise UserInputError(f"{name} is already a hook point: is an SAE already spliced at "
                                             f"{site.hook_name}? Splice one SAE per hook.")
                    model.hook_dict[name] = point
                    model.mod_dict[name] = point
                    added.append(name)
                model.add_hook(site.hook_name, site.hook, dir="fwd", level=level)
            yield self
        finally:
            model.reset_hooks(including_permanent=False, level=level)
            for name in added:
                point = model.hook_dict.pop(name)
                model.mod_dict.pop(name, None)
                point.remove_hooks("both", including_permanent=True)

    def run_with_saes(self, inputs: Any, saes: Mapping[str, Dictionary], positions: Positions = "all",
                      use_error_term: bool = False, **forward_kwargs: Any) -> Any:
        """The forward (same keywords: return_type, ...) with `saes` spliced at `positions` (see `saes`)."""
        model: Any = self
        run_inputs = model.coerce_inputs(inputs)
        with self.saes(saes, positions=positions, use_error_term=use_error_term, inputs=run_inputs):
            return model(run_inputs, **forward_kwargs)

    def run_with_cache_with_saes(self, inputs: Any, saes: Mapping[str, Dictionary], positions: Positions = "all",
                                 use_error_term: bool = False, **cache_kwargs: Any) -> Any:
        """`run_with_cache` with `saes` spliced; feature activations are cached as ``<hook>.hook_sae_acts_post``."""
        model: Any = self
        run_inputs = model.coerce_inputs(inputs)
        with self.saes(saes, positions=positions, use_error_term=use_error_term, inputs=run_inputs):
            return model.run_with_cache(run_inputs, **cache_kwargs)

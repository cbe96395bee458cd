"""Streaming (MLP input, MLP output) pairs of every covered layer, at image and text positions.

A chunk's rows are ``[x_0, y_0, x_1, y_1, ...]`` concatenated over the covered layers (each
``d_model`` wide): x_l is the MLP's input (``block.mlp_input``: the block's second norm applied to
``hook_resid_mid``, or its one norm applied to ``hook_resid_pre`` in a parallel block, weight included:
exactly what the MLP reads) and y_l the block's ``hook_mlp_out`` (what it adds
to the residual stream, after a post-MLP norm where the family has one). One row per token, so the
SAE machinery (`ShuffleBuffer`, disk cache, resume by chunk index) streams pairs unchanged.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor

from vlens.core.model import HookedVLM
from vlens.sae.activations import ActivationChunk, ActivationOptions, ActivationSource, TokenSites, site_mask
from vlens.utils.errors import UserInputError
from vlens.utils.provenance import weights_digest


def split_pairs(rows: Float[Tensor, "n width"], n_layers: int) -> tuple[list[Tensor], list[Tensor]]:
    """(inputs, outputs) per covered layer, each [n, d_model], from rows ``[x_0, y_0, x_1, y_1, ...]``."""
    parts = rows.reshape(rows.shape[0], n_layers, 2, -1)
    return [parts[:, i, 0] for i in range(n_layers)], [parts[:, i, 1] for i in range(n_layers)]


def join_pairs(xs: Sequence[Tensor], ys: Sequence[Tensor]) -> Float[Tensor, "n width"]:
    """The inverse of `split_pairs`."""
    return torch.stack([torch.stack([x, y], dim=1) for x, y in zip(xs, ys, strict=True)], dim=1).flatten(1)


def check_layers(model: HookedVLM, layers: Sequence[int] | None) -> tuple[int, ...]:
    """The covered layers: every decoder layer by default, else the given ones (checked)."""
    n = model.cfg.n_layers
    chosen = tuple(range(n)) if layers is None else tuple(sorted({int(layer) for layer in layers}))
    bad = [layer for layer in chosen if not 0 <= layer < n]
    if bad or not chosen:
        raise UserInputError(f"transcoder layers {list(layers or [])} must be in [0, {n - 1}] (the model has {n} layers).")
    return chosen


@torch.no_grad()
def mlp_pairs(model: HookedVLM, inputs: Any, layers: Sequence[int]) -> tuple[list[Tensor], list[Tensor]]:
    """(MLP inputs, MLP outputs) of `layers`, each [batch, pos, d_model], from one forward."""
    reads = {layer: f"blocks.{layer}.{model.blocks[layer].mlp_input_hook}" for layer in layers}  # resid_pre if parallel
    names = [name for layer in layers for name in (reads[layer], f"blocks.{layer}.hook_mlp_out")]
    stop = max(layers) + 1
    _, cache = model.run_with_cache(inputs, names_filter=names, stop_at_layer=stop if stop < model.cfg.n_layers else None)
    xs = [model.blocks[layer].mlp_input(cache[reads[layer]]) for layer in layers]
    ys = [cache[f"blocks.{layer}.hook_mlp_out"] for layer in layers]
    return xs, ys


class PairSource(ActivationSource):
    """`ActivationSource` of (MLP input, MLP output) pairs of `layers` (every layer by default).

    positions / cells / prompts_per_chunk / chat / cache_dir: as `ActivationSource` (positions "all"
    streams image and text tokens alike).
    """

    def __init__(self, model: HookedVLM, examples: Sequence[Any], layers: Sequence[int] | None = None,
                 positions: str = "all", cells: Sequence[tuple[int, int]] | None = None, prompts_per_chunk: int = 8,
                 chat: bool = True, cache_dir: str | os.PathLike | None = None):
        self.layers = check_layers(model, layers)
        options = ActivationOptions(f"blocks.{self.layers[-1]}.hook_mlp_out", positions=positions,
                                    cells=tuple(cells) if cells is not None else None,
                                    prompts_per_chunk=prompts_per_chunk, chat=chat)
        super().__init__(model, examples, options, cache_dir=cache_dir)

    def manifest(self) -> dict[str, Any]:
        return {"options": asdict(self.options), "layers": list(self.layers), "pairs": "mlp_in/mlp_out",
                "n_examples": len(self.examples), "model": weights_digest(self.model), "format": 1}

    @torch.no_grad()
    def compute(self, index: int) -> ActivationChunk:
        ids, prompts = self.prompts(index)
        inputs = self.inputs(prompts)
        xs, ys = mlp_pairs(self.model, inputs, self.layers)
        mask, cell, is_image = site_mask(self.model, inputs, self.options)
        rows, positions = mask.nonzero(as_tuple=True)
        pairs = join_pairs([x[rows, positions].float().cpu() for x in xs], [y[rows, positions].float().cpu() for y in ys])
        sites = TokenSites(example=torch.tensor(ids, dtype=torch.long)[rows], position=positions,
                           cell=cell[rows, positions], is_image=is_image[rows, positions])
        return ActivationChunk(pairs.contiguous(), sites)

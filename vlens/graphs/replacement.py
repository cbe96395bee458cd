"""The local replacement model of one prompt: MLPs replaced by transcoders + error, attention and norms frozen.

`ReplacementModel(model, transcoders).run(inputs)` runs the real model once and keeps what the
replacement freezes (`PromptRun`): every decoder norm's scale (``*.hook_scale``), every softmax
attention pattern (``attn.hook_pattern``), each layer's MLP output and its transcoder's error
``mlp_out - decode(acts)`` (a layer without a transcoder: the whole MLP output is its error). Inside
``replacement.frozen(run)`` every forward uses those values: the norms divide by the frozen scales,
the attention applies the frozen patterns, each MLP output is the transcoder's reconstruction (its
features computed, non-linearly, from the frozen-norm input) plus the frozen error. On the prompt
itself the logits equal the model's; changing a feature (``blocks.{l}.hook_tc_acts``) moves only
what the replacement lets it move. Hooks live only inside the context (and `__call__`).

A model is *linear* in the residual stream under these freezes when every token mixer is softmax
attention without an input-dependent output gate (Gated DeltaNet layers and gated attention are
not: `linear_problem` says why); attribution graphs need that.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor

from vlens.core.components.gated_attention import GatedAttention
from vlens.core.model import HookedVLM
from vlens.transcoders.activations import mlp_pairs
from vlens.transcoders.model import Transcoders
from vlens.transcoders.splice import check_model, splice_transcoders
from vlens.utils.errors import UserInputError


@dataclass
class PromptRun:
    """What one prompt's real run froze (batch 1 or the run's batch).

    scales: hook name -> [batch, pos, 1] (every decoder norm, the final one included).
    patterns: hook name -> [batch, heads, q, k].
    mlp_out: per decoder layer [batch, pos, d_model]. inputs / acts: per covered layer index, the MLP
    input and feature activations [batch, pos, d_tc]. errors: per decoder layer [batch, pos, d_model].
    logits: [batch, pos, d_vocab].
    """

    inputs: Any
    logits: Tensor
    scales: dict[str, Tensor] = field(default_factory=dict)
    patterns: dict[str, Tensor] = field(default_factory=dict)
    mlp_out: list[Tensor] = field(default_factory=list)
    mlp_inputs: list[Tensor] = field(default_factory=list)
    acts: list[Tensor] = field(default_factory=list)
    errors: list[Tensor] = field(default_factory=list)


def is_frozen_scale(name: str) -> bool:
    return name.endswith("hook_scale") and not name.startswith("vision.")


def is_pattern(name: str) -> bool:
    return name.endswith("attn.hook_pattern") and name.startswith("blocks.")


def linear_problem(model: HookedVLM) -> str | None:
    """Why the model is not linear under frozen attention and norms (None: it is)."""
    for layer, block in enumerate(model.blocks):
        if model.cfg.is_linear_attention(layer):
            return (f"layer {layer} is Gated DeltaNet linear attention: its gates and recurrent state depend on the "
                    "input, so no frozen pattern makes it linear in the residual stream")
        if isinstance(block.attn, GatedAttention):
            return (f"layer {layer}'s attention multiplies each head by an input-dependent gate (sigmoid of a query "
                    "projection), which frozen patterns do not linearise")
    return None


def frozen_value(value: Tensor):
    """A hook that replaces the activation by `value` (broadcast to the activation's batch), without gradient."""
    def hook(activation: Tensor, hook: Any = None) -> Tensor:
        return value.detach().to(activation.dtype).expand(activation.shape)
    return hook


class ReplacementModel:
    """`model` with `transcoders` as its MLPs, around one prompt's frozen run (see the module doc)."""

    def __init__(self, model: HookedVLM, transcoders: Transcoders):
        check_model(model, transcoders)
        self.model, self.transcoders = model, transcoders

    @property
    def layer_index(self) -> dict[int, int]:
        """decoder layer -> its index among the transcoders' covered layers."""
        return {layer: i for i, layer in enumerate(self.transcoders.cfg.layers)}

    @torch.no_grad()
    def run(self, inputs: Any) -> PromptRun:
        """The real run of `inputs` and everything the replacement freezes from it."""
        model, tc = self.model, self.transcoders
        inputs = model.coerce_inputs(inputs)
        names = lambda name: is_frozen_scale(name) or is_pattern(name)  # noqa: E731
        logits, cache = model.run_with_cache(inputs, names_filter=names)
        run = PromptRun(inputs=inputs, logits=logits)
        run.scales = {name: cache[name] for name in cache.keys() if is_frozen_scale(name)}
        run.patterns = {name: cache[name] for name in cache.keys() if is_pattern(name)}
        xs, ys = mlp_pairs(model, inputs, range(model.cfg.n_layers))
        run.mlp_out = ys
        run.mlp_inputs = [xs[layer] for layer in tc.cfg.layers]
        run.acts = [tc.encode(i, x) for i, x in enumerate(run.mlp_inputs)]
        index = self.layer_index
        run.errors = [ys[layer] - tc.decode(index[layer], run.acts, xs[layer]).to(ys[layer].dtype)
                      if layer in index else ys[layer] for layer in range(model.cfg.n_layers)]
        return run

    def freeze_hooks(self, run: PromptRun) -> list[tuple[str, Any]]:
        """Forward hooks that hold every decoder norm's scale and attention pattern at the run's values."""
        return [(name, frozen_value(value)) for name, value in {**run.scales, **run.patterns}.items()]

    @contextmanager
    def frozen(self, run: PromptRun) -> Iterator[ReplacementModel]:
        """Every forward inside the block is the replacement model of `run` (see the module doc)."""
        index = self.layer_index
        uncovered = [(f"blocks.{layer}.hook_mlp_out", frozen_value(run.mlp_out[layer]))
                     for layer in range(self.model.cfg.n_layers) if layer not in index]
        errors = {layer: run.errors[layer] for layer in index}
        with ExitStack() as stack:
            stack.enter_context(self.model.hooks(fwd_hooks=self.freeze_hooks(run) + uncovered))
            stack.enter_context(splice_transcoders(self.model, self.transcoders, error=errors))
            yield self

    def __call__(self, inputs: Any, run: PromptRun | None = None) -> Float[Tensor, "batch pos d_vocab"]:
        """The replacement model's logits on `inputs` (frozen at `run`, by default the run of `inputs` itself)."""
        inputs = self.model.coerce_inputs(inputs)
        run = run if run is not None else self.run(inputs)
        if inputs.input_ids.shape[1] != run.inputs.input_ids.shape[1]:
            raise UserInputError("the replacement model is frozen at one prompt: run it on inputs of that prompt's length.")
        with self.frozen(run):
            return self.model(inputs)

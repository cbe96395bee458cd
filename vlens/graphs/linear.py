"""The linearised replacement model: a forward whose inputs are leaves, and batched backward passes.

With attention patterns and norm scales frozen and every MLP output held at
``c_l + x_l @ W_skip`` (``c_l`` = the features' decoding + ``b_dec`` + the error: a constant leaf; the
skip term stays live), the model is affine in its input embeddings, its DeepStack features and the
``c_l``. A backward pass from a direction injected at one target (a feature's encoder at its layer's
MLP input, or the unembedding direction at the final residual) gives the gradient at every leaf; its
dot product with a source's vector is the source's direct effect on the target (the edge weight):

    feature s -> t:  a_s * sum_{j written by s} W_dec[s, j] . dT/dc_j[pos_s]
    error (l, p) -> t:  err_l[p] . dT/dc_l[p]
    token p -> t:  (embedding[p] . dT/dembed[p]) + (DeepStack features at p . their gradients)

The forward is run once on `batch` copies of the prompt and each copy's row gets its own target, so
one backward pass computes `batch` rows of the adjacency matrix (circuit-tracer's scheme).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor

from vlens.core.runtime import RunState
from vlens.graphs.replacement import PromptRun, ReplacementModel


@dataclass
class LinearForward:
    """One forward of the linearised model on `batch` copies: its leaves and the tensors to inject into."""

    embeds: Tensor  # [batch, pos, d_model] leaf
    deepstack: dict[int, tuple[Tensor, Tensor]]  # layer -> (positions [n_img], leaf [batch * n_img, d_model])
    constants: list[Tensor]  # per decoder layer: leaf c_l [batch, pos, d_model]
    mlp_inputs: dict[int, Tensor]  # covered decoder layer -> [batch, pos, d_model]
    final: Tensor  # [batch, pos, d_model]: lm_head's input (ln_final_w * ln_final(resid))

    def leaves(self) -> list[Tensor]:
        return [self.embeds, *self.constants, *(leaf for _, leaf in self.deepstack.values())]


def linear_forward(replacement: ReplacementModel, run: PromptRun, batch: int, zero_inputs: bool = False) -> LinearForward:
    """The linearised model's forward (module doc). zero_inputs: every input node at 0 (embeddings,
    DeepStack features, features, errors): what remains is the model's constant (biases)."""
    model, tc = replacement.model, replacement.transcoders
    index = replacement.layer_index
    with torch.no_grad():
        state = model.start_run(run.inputs)
    embeds = state.resid.detach()
    embeds = (torch.zeros_like(embeds) if zero_inputs else embeds).expand(batch, -1, -1).clone().requires_grad_(True)
    deepstack = {}
    for layer, (mask, feats) in state.deepstack.items():
        values = torch.zeros_like(feats) if zero_inputs else feats.detach()
        deepstack[layer] = (mask[0].nonzero().flatten(), values.repeat(batch, 1).clone().requires_grad_(True))
    constants = []
    for layer in range(model.cfg.n_layers):
        if layer in index:
            i = index[layer]
            value = (tc.b_dec[i].detach().to(run.mlp_out[layer].dtype).expand_as(run.mlp_out[layer]) if zero_inputs
                     else run.mlp_out[layer] - tc.skip(i, run.mlp_inputs[i]).to(run.mlp_out[layer].dtype))
        else:
            value = torch.zeros_like(run.mlp_out[layer]) if zero_inputs else run.mlp_out[layer]
        constants.append(value.detach().expand(batch, -1, -1).clone().requires_grad_(True))
    mlp_inputs: dict[int, Tensor] = {}

    def read_input(layer: int):
        def hook(resid: Tensor, hook: Any = None) -> None:
            mlp_inputs[layer] = model.blocks[layer].mlp_input(resid)  # ln2(resid_mid); ln1(resid_pre) if parallel
        return hook

    def write_output(layer: int):
        def hook(mlp_out: Tensor, hook: Any = None) -> Tensor:
            out = constants[layer]
            if layer in index and tc.W_skip is not None:
                out = out + tc.skip(index[layer], mlp_inputs[layer]).to(out.dtype)
            return out.to(mlp_out.dtype)
        return hook

    hooks = replacement.freeze_hooks(run)
    hooks += [(f"blocks.{layer}.{model.blocks[layer].mlp_input_hook}", read_input(layer)) for layer in index]
    hooks += [(f"blocks.{layer}.hook_mlp_out", write_output(layer)) for layer in range(model.cfg.n_layers)]
    mask_rows = {layer: torch.zeros(batch, embeds.shape[1], dtype=torch.bool, device=embeds.device)
                 for layer in deepstack}
    for layer, (positions, _) in deepstack.items():
        mask_rows[layer][:, positions] = True
    batched = RunState(resid=embeds, cos=state.cos, sin=state.sin, masks=state.masks, position_ids=state.position_ids,
                       deepstack={layer: (mask_rows[layer], leaf) for layer, (_, leaf) in deepstack.items()})
    with model.hooks(fwd_hooks=hooks):
        resid = model.run_blocks(embeds, batched)
        final = model.finish(resid, "resid")
    return LinearForward(embeds, deepstack, constants, mlp_inputs, final)


@dataclass
class Injection:
    """The targets of one backward pass, one per batch row: where and what to inject.

    layers: per row, the decoder layer whose MLP input receives the vector, or -1 for the final residual.
    positions: per row, the position. vectors: [rows, d_model].
    """

    layers: Sequence[int]
    positions: Sequence[int]
    vectors: Float[Tensor, "rows d_model"]


def backward_rows(forward: LinearForward, injection: Injection) -> tuple[Tensor, list[Tensor], dict[int, Tensor]]:
    """Gradients of the injected targets at every leaf: (embeddings [rows, pos, d], constants per decoder layer
    [rows, pos, d], DeepStack per layer [rows, n_img, d]); rows beyond the injection's are zero."""
    batch = forward.embeds.shape[0]
    grads = {layer: torch.zeros_like(x) for layer, x in forward.mlp_inputs.items()}
    final_grad = torch.zeros_like(forward.final)
    for row, (layer, pos) in enumerate(zip(injection.layers, injection.positions, strict=True)):
        target = final_grad if layer < 0 else grads[layer]
        target[row, pos] = injection.vectors[row].to(target.dtype)
    outputs = [forward.final, *(forward.mlp_inputs[layer] for layer in grads)]
    grad_outputs = [final_grad, *grads.values()]
    leaves = forward.leaves()
    raw = torch.autograd.grad(outputs, leaves, grad_outputs, retain_graph=True, allow_unused=True)
    found = [torch.zeros_like(leaf) if g is None else g for leaf, g in zip(leaves, raw, strict=True)]
    n_layers = len(forward.constants)
    embeds, constants = found[0], list(found[1:1 + n_layers])
    deepstack = {layer: g.reshape(batch, -1, g.shape[-1])
                 for layer, g in zip(forward.deepstack, found[1 + n_layers:], strict=True)}
    return embeds, constants, deepstack


__all__ = ["Injection", "LinearForward", "backward_rows", "linear_forward"]

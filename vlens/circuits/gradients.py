"""Gradients of the metric with respect to every receiver's input, from one forward and one backward.

A receiver reads the residual stream through its block's norm, and in a standard forward all
of a layer's q / k / v (and its MLP) share one copy of the residual. The gradient with respect
to *one* receiver's input (as if it had its own copy of the residual) is the
vector-Jacobian product of that receiver's own computation with the metric's gradient at its
output:

    dM/dx_{q,h} = J(x -> q_proj(ln1(x))[h])^T  dM/dq_h        (x = the residual entering the layer)

and likewise for each key / value head (and each port of a Gated DeltaNet layer: its
query / key heads, values, write strength, decay and output gate, through its short
convolution) and for the MLP (x = the residual entering the MLP, output hook_mlp_out); for the
logits it is dM/d(final residual). One backward gives the metric's gradient at every port's
hook and at dmlp_out; the per-receiver products then run on the recorded graph, all receivers
of a layer at once (`is_grads_batched`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from vlens.circuits.graph import LayerSpec
from vlens.circuits.runs import CircuitMetric, RunRecord
from vlens.core.hooks import act_name
from vlens.core.runtime import RunState

if TYPE_CHECKING:
    from vlens.core.model import HookedVLM


@dataclass
class GradientRun:
    """One forward + backward: the metric per pair [n_pairs], the run's record (detached) and
    `layers()`, which yields (layer, receiver gradients [n_receivers_of_layer, batch, pos, d_model])
    in the graph's receiver order: the layer's ports (q heads, k heads, v heads, ...), then its
    MLP; last (n_layers, the logits' gradient [1, batch, pos, d_model])."""

    values: Tensor
    record: RunRecord
    _saved: dict
    _grads: dict
    _model: HookedVLM
    _specs: list[LayerSpec]

    def layers(self) -> Iterator[tuple[int, Tensor]]:
        model, saved, grads = self._model, self._saved, self._grads
        cfg = model.cfg
        for layer in range(cfg.n_layers):
            ports = self._specs[layer].ports
            names = [port_hook(layer, port.hook) for port in ports]
            outputs = [saved[n] for n in names]
            cotangents = []
            n_receivers = sum(port.count for port in ports)
            start = 0
            for output, name, port in zip(outputs, names, ports, strict=True):
                grad = grads[name]
                count = port.count
                cot = output.new_zeros((n_receivers, *output.shape))
                if grad is not None:
                    for j in range(count):
                        cot[start + j, :, :, j] = grad[:, :, j]
                cotangents.append(cot)
                start += count
            resid = saved[act_name("resid_pre", layer)]
            attention = _batched_vjp(outputs, resid, cotangents)  # [n_receivers, batch, pos, d_model]
            mlp_grad = grads[act_name("mlp_out", layer)]
            mid = saved[act_name("resid_mid", layer)]
            if mlp_grad is None:
                mlp = torch.zeros_like(mid).unsqueeze(0)
            else:
                (mlp,) = torch.autograd.grad(saved[act_name("mlp_out", layer)], mid, grad_outputs=mlp_grad,
                                             retain_graph=True)
                mlp = mlp.unsqueeze(0)
            yield layer, torch.cat([attention.float(), mlp.to(attention.device).float()])
        final = grads["final"]
        yield cfg.n_layers, (torch.zeros_like(saved["final"]) if final is None else final).float().unsqueeze(0)


def _batched_vjp(outputs: list[Tensor], inputs: Tensor, cotangents: list[Tensor]) -> Tensor:
    """sum_o J_o^T c_o for a batch of cotangents (dim 0), on the recorded graph."""
    try:
        (grad,) = torch.autograd.grad(outputs, inputs, grad_outputs=cotangents, retain_graph=True,
                                      is_grads_batched=True, allow_unused=True)
    except RuntimeError:  # an op without a batching rule: one product at a time
        parts = []
        for i in range(cotangents[0].shape[0]):
            (part,) = torch.autograd.grad(outputs, inputs, grad_outputs=[c[i] for c in cotangents],
                                          retain_graph=True, allow_unused=True)
            parts.append(torch.zeros_like(inputs) if part is None else part)
        return torch.stack(parts)
    return torch.zeros(cotangents[0].shape[0], *inputs.shape, dtype=inputs.dtype, device=inputs.device) \
        if grad is None else grad


def port_hook(layer: int, hook: str) -> str:
    """The full name of a mixer port's hook (`MixerPort.hook`: "q", "k", "v", "beta", "g", "output_gate")."""
    return f"blocks.{layer}.attn.hook_{hook}"


def gradient_run(model: HookedVLM, state: RunState, metric: CircuitMetric, specs: list[LayerSpec]) -> GradientRun:
    """Forward `state` (its `resid` and DeepStack features as given) with gradients, backward the
    sum of the metric over pairs, and return the receivers' gradients lazily (`GradientRun.layers`);
    specs: each layer's mixer (`CircuitGraph.layers`)."""
    cfg = model.cfg
    saved: dict[str, Tensor] = {}

    def keep(act: Tensor, hook) -> None:
        saved[hook.name] = act

    ports = {layer: [port_hook(layer, port.hook) for port in specs[layer].ports] for layer in range(cfg.n_layers)}
    names = [act_name(kind, layer) for layer in range(cfg.n_layers) for kind in ("resid_pre", "resid_mid", "z",
                                                                                   "mlp_out")]
    names += [name for layer in range(cfg.n_layers) for name in ports[layer]]
    with torch.enable_grad():
        resid = state.resid.detach().requires_grad_(True)
        with model.hooks(fwd_hooks=[(name, keep) for name in names]):
            final = model.run_blocks(resid, state)
        saved["final"] = final
        values = metric(model, final)[0]
        targets = {name: saved[name] for layer in range(cfg.n_layers)
                   for name in (*ports[layer], act_name("mlp_out", layer))}
        targets["final"] = final
        grads = dict(zip(targets, torch.autograd.grad(values.sum(), list(targets.values()), retain_graph=True,
                                                       allow_unused=True), strict=True))
    record = RunRecord(resid_pre=[saved[act_name("resid_pre", m)].detach() for m in range(cfg.n_layers)],
                       resid_mid=[saved[act_name("resid_mid", m)].detach() for m in range(cfg.n_layers)],
                       z=[saved[act_name("z", m)].detach() for m in range(cfg.n_layers)],
                       mlp_out=[saved[act_name("mlp_out", m)].detach() for m in range(cfg.n_layers)],
                       final=final.detach())
    return GradientRun(values=values.detach(), record=record, _saved=saved, _grads=grads, _model=model, _specs=specs)

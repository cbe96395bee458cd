"""Gated (SwiGLU-style) MLP around the HF projections, with TransformerLens hooks."""

from __future__ import annotations

import torch
from jaxtyping import Float
from torch import Tensor, nn
from transformers.activations import ACT2FN

from vlens.core.hooks import HookPoint


class GatedMLP(nn.Module):
    """down(act(gate(x)) * up(x)).

    hook_pre: gate(x) before the activation; hook_pre_linear: up(x); hook_post: the product
    fed to the down projection. All [batch, pos, d_mlp].
    """

    def __init__(self, gate_proj: nn.Linear, up_proj: nn.Linear, down_proj: nn.Linear, act_fn: str):
        super().__init__()
        self.gate_proj = gate_proj
        self.up_proj = up_proj
        self.down_proj = down_proj
        self.act = ACT2FN[act_fn]
        self.hook_pre = HookPoint()
        self.hook_pre_linear = HookPoint()
        self.hook_post = HookPoint()

    @property
    def W_in(self) -> Float[Tensor, "d_model d_mlp"]:
        return self.up_proj.weight.T

    @property
    def W_gate(self) -> Float[Tensor, "d_model d_mlp"]:
        return self.gate_proj.weight.T

    @property
    def W_out(self) -> Float[Tensor, "d_mlp d_model"]:
        return self.down_proj.weight.T

    @property
    def b_in(self) -> Float[Tensor, "d_mlp"]:
        return _bias(self.up_proj)

    @property
    def b_gate(self) -> Float[Tensor, "d_mlp"]:
        return _bias(self.gate_proj)

    @property
    def b_out(self) -> Float[Tensor, "d_model"]:
        """The down projection's bias (zeros when it has none): what the MLP adds besides its neurons."""
        return _bias(self.down_proj)

    def forward(self, x: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"]:
        gate = self.hook_pre(self.gate_proj(x))
        up = self.hook_pre_linear(self.up_proj(x))
        post = self.hook_post(self.act(gate) * up)
        return self.down_proj(post)


class FusedGatedMLP(GatedMLP):
    """`GatedMLP` on one fused input projection, ``gate, up = gate_up_proj(x).chunk(2, -1)`` (the gate's
    d_mlp rows first, as GLM-4V stores them); the same hooks and weight views (halves of the fused weight)."""

    def __init__(self, gate_up_proj: nn.Linear, down_proj: nn.Linear, act_fn: str):
        nn.Module.__init__(self)
        self.gate_up_proj = gate_up_proj
        self.down_proj = down_proj
        self.d_mlp = down_proj.in_features
        self.act = ACT2FN[act_fn]
        self.hook_pre = HookPoint()
        self.hook_pre_linear = HookPoint()
        self.hook_post = HookPoint()

    @property
    def W_in(self) -> Float[Tensor, "d_model d_mlp"]:
        return self.gate_up_proj.weight[self.d_mlp:].T

    @property
    def W_gate(self) -> Float[Tensor, "d_model d_mlp"]:
        return self.gate_up_proj.weight[:self.d_mlp].T

    @property
    def b_in(self) -> Float[Tensor, "d_mlp"]:
        return _bias(self.gate_up_proj)[self.d_mlp:]

    @property
    def b_gate(self) -> Float[Tensor, "d_mlp"]:
        return _bias(self.gate_up_proj)[:self.d_mlp]

    def forward(self, x: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"]:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        post = self.hook_post(self.act(self.hook_pre(gate)) * self.hook_pre_linear(up))
        return self.down_proj(post)


def _bias(linear: nn.Linear) -> Tensor:
    if linear.bias is not None:
        return linear.bias
    return torch.zeros(linear.out_features, dtype=linear.weight.dtype, device=linear.weight.device)

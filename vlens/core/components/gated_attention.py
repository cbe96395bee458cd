"""Softmax attention with a per-head output gate (Qwen3.5's full-attention layers).

HF's q_proj writes, per head, the query and a gate side by side ([..., n_heads, 2 * d_head]);
the attention output is multiplied by sigmoid(gate) before o_proj. Here:

- `hook_q` [batch, pos, n_heads, d_head] is the query half (before the q norm and rotary, as in
  `Attention`); `W_Q` / `b_Q` are views of those rows of q_proj only;
- `hook_output_gate` [batch, pos, n_heads, d_head] is sigmoid(gate), the factor applied;
- `hook_z` [batch, pos, n_heads, d_head] is the gated output, what o_proj reads, so
  `sum_h z_h @ W_O[h] + b_O == hook_attn_out` and a `hook_z` edit equals an edit of o_proj's input.
  `hook_pattern` / `hook_attn_scores` are the softmax attention's own, unchanged by the gate.
"""

from __future__ import annotations

import torch
from jaxtyping import Float
from torch import Tensor

from vlens.core.components.attention import Attention
from vlens.core.hooks import HookPoint


class GatedAttention(Attention):
    """`Attention` whose q_proj also produces an output gate per head (see the module docstring)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.hook_output_gate = HookPoint()  # [batch, pos, n_heads, d_head], sigmoid(gate)

    def project_queries(self, x: Tensor) -> tuple[Tensor, Tensor]:
        batch, pos, _ = x.shape
        both = self.q_proj(x).view(batch, pos, -1, 2 * self.cfg.d_head)
        query, gate = torch.chunk(both, 2, dim=-1)
        return query, gate

    def gate_heads(self, z: Tensor, gate: Tensor | None) -> Tensor:
        if gate is None:
            raise RuntimeError("GatedAttention needs the gate its project_queries returned")
        return z * self.hook_output_gate(torch.sigmoid(gate))

    def _query_rows(self, tensor: Tensor) -> Tensor:
        """The query half of q_proj's per-head [query; gate] rows: [n_heads, d_head, ...]."""
        n, d = self.cfg.n_heads, self.cfg.d_head
        return tensor.view(n, 2, d, *tensor.shape[1:])[:, 0]

    @property
    def W_Q(self) -> Float[Tensor, "n_heads d_model d_head"]:
        return self._query_rows(self.q_proj.weight).transpose(1, 2)

    @property
    def b_Q(self) -> Float[Tensor, "n_heads d_head"]:
        if self.q_proj.bias is None:
            return torch.zeros(self.cfg.n_heads, self.cfg.d_head, dtype=self.q_proj.weight.dtype,
                               device=self.q_proj.weight.device)
        return self._query_rows(self.q_proj.bias)

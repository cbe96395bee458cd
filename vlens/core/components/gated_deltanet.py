"""Gated DeltaNet (Qwen3.5's linear attention) with hooks on every intermediate, heads like attention heads.

One layer, following HF's `Qwen3_5GatedDeltaNet` step by step (and calling HF's own short
convolution and gated-delta-rule functions, so the numbers are HF's):

    x  (padding positions zeroed, as HF does)
    [q; k; v] = silu(causal depthwise conv(in_proj_qkv(x)))          -> hook_q, hook_k, hook_v
    beta = sigmoid(in_proj_b(x)),  g = -exp(A_log) * softplus(in_proj_a(x) + dt_bias)
                                                                      -> hook_beta, hook_g
    per value head h (query/key head h // (n_heads / n_key_heads)), with q, k L2-normalised and
    q scaled by d_key^-1/2:
        S_t = exp(g_t) S_{t-1} + k_t (beta_t (v_t - exp(g_t) S_{t-1}^T k_t))^T      [d_key, d_head]
        o_t = S_t^T q_t                                               -> hook_core_out
    gate = silu(in_proj_z(x))                                         -> hook_output_gate
    z = w * RMSNorm(o) * gate   (per head; the norm's weight w is shared by the heads)   -> hook_z
    out = out_proj(z)   (z flattened over heads: sum_h z_h @ W_O[h])

`hook_z` [batch, pos, n_heads, d_head] is what out_proj reads, split by value head, so a head
here is what it is in softmax attention for every method that works on `hook_z` (patching,
ablation, HeadLens, head attribution): the part of the layer's output one head writes. There is
no attention pattern (`hook_pattern` / `hook_attn_scores` do not exist on these layers).

`hook_recurrent_state` [batch, pos, n_heads, d_key, d_head] is the state S_t after each token. It
is only materialised while something hooks it (the token-by-token recurrence, HF's
`torch_recurrent_gated_delta_rule` arithmetic, instead of the chunked rule). An edit replaces the
state at the (row, position, head) entries it changes, and the recurrence continues from the
replaced state (later positions are recomputed, so patching one position's state propagates);
the hook sees the unedited states, so an edit that depends on the state's value applied at
several positions acts on each position's unedited value.

Decoding keeps HF's recurrent cache: the convolution's last inputs and the final state per layer
(`KVCache.conv_states` / `recurrent_states`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import einops
import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor, nn

from vlens.core.components.attention import AttentionMasks, KVCache
from vlens.core.config import VLMConfig
from vlens.core.hooks import HookPoint, is_observed


@dataclass
class DeltaRuleKernels:
    """The HF module's own functions (torch fallbacks, or the fused kernels HF picked): the chunked and
    the recurrent gated delta rule, the causal conv over a sequence and its one-step update."""

    chunk_rule: Callable
    recurrent_rule: Callable
    conv: Callable
    conv_update: Callable


class PatternlessMixer(nn.Module):
    """A token mixer without an attention pattern whose heads are slices of its `out_proj` input (`hook_z`):
    TransformerLens's W_O / b_O views of that projection (Gated DeltaNet, LFM2's short convolution)."""

    is_linear_attention = True
    n_heads: int
    out_proj: nn.Linear

    @property
    def W_O(self) -> Float[Tensor, "n_heads d_head d_model"]:
        return einops.rearrange(self.out_proj.weight, "m (n h) -> n h m", n=self.n_heads)

    @property
    def b_O(self) -> Float[Tensor, "d_model"]:
        weight = self.out_proj.weight
        if self.out_proj.bias is not None:
            return self.out_proj.bias
        return torch.zeros(weight.shape[0], dtype=weight.dtype, device=weight.device)

    def needs_pattern(self) -> bool:
        """Never: no attention pattern here."""
        return False


class GatedDeltaNet(PatternlessMixer):
    """Qwen3.5's linear-attention token mixer with hooks (module docstring); HF's parameters in place.

    Its forward takes a block's attention arguments (cos / sin are unused: no rotary here).
    """

    # the HF layer's modules and parameters, held as they are
    in_proj_qkv: nn.Linear
    in_proj_z: nn.Linear
    in_proj_b: nn.Linear
    in_proj_a: nn.Linear
    conv1d: nn.Conv1d
    out_proj: nn.Linear
    norm: Any  # HF's RMSNormGated (weight, variance_epsilon)
    dt_bias: nn.Parameter
    A_log: nn.Parameter

    def __init__(self, cfg: VLMConfig, layer: int, hf_layer: Any, kernels: DeltaRuleKernels):
        super().__init__()
        self.cfg, self.layer, self.kernels = cfg, layer, kernels
        self.n_heads, self.d_head = cfg.linear_n_heads, cfg.linear_d_head
        self.n_key_heads, self.d_key = cfg.linear_n_key_heads, cfg.linear_d_key
        if self.n_heads % self.n_key_heads:
            raise RuntimeError(f"{self.n_heads} value heads do not divide into {self.n_key_heads} key heads")
        # the HF modules themselves (their parameters are HF's)
        self.in_proj_qkv = hf_layer.in_proj_qkv
        self.in_proj_z = hf_layer.in_proj_z
        self.in_proj_b = hf_layer.in_proj_b
        self.in_proj_a = hf_layer.in_proj_a
        self.conv1d = hf_layer.conv1d
        self.dt_bias = hf_layer.dt_bias
        self.A_log = hf_layer.A_log
        self.norm = hf_layer.norm
        self.out_proj = hf_layer.out_proj
        self.activation = hf_layer.activation
        self.conv_kernel = hf_layer.conv_kernel_size

        self.hook_q = HookPoint()  # [batch, pos, n_key_heads, d_key] after the conv (before L2 norm)
        self.hook_k = HookPoint()  # [batch, pos, n_key_heads, d_key]
        self.hook_v = HookPoint()  # [batch, pos, n_heads, d_head]
        self.hook_beta = HookPoint()  # [batch, pos, n_heads] write strength in (0, 1)
        self.hook_g = HookPoint()  # [batch, pos, n_heads] log decay (<= 0)
        self.hook_recurrent_state = HookPoint()  # [batch, pos, n_heads, d_key, d_head], only when hooked
        self.hook_core_out = HookPoint()  # [batch, pos, n_heads, d_head] delta-rule read-out
        self.hook_output_gate = HookPoint()  # [batch, pos, n_heads, d_head] silu(in_proj_z(x))
        self.hook_z = HookPoint()  # [batch, pos, n_heads, d_head] out_proj's input by head
        self.hook_result = HookPoint()  # [batch, pos, n_heads, d_model] with cfg.use_attn_result

    def state_hooked(self) -> bool:
        return is_observed(self.hook_recurrent_state)

    # ---- forward ----
    def forward(self, x: Float[Tensor, "batch pos d_model"], cos: Tensor | None = None, sin: Tensor | None = None,
                masks: AttentionMasks | None = None, kv_cache: KVCache | None = None) -> Float[Tensor, "batch pos d_model"]:
        real = None if masks is None else masks.query_real
        if real is not None:  # HF zeroes padding inputs, so the state starts at a row's first real token
            x = (x * real.to(x.device)[:, :, None]).to(x.dtype)
        batch, pos, _ = x.shape
        conv_state = None if kv_cache is None else kv_cache.conv_states[self.layer]
        state = None if kv_cache is None else kv_cache.recurrent_states[self.layer]

        mixed = self.in_proj_qkv(x).transpose(1, 2)  # [batch, conv_dim, pos]
        gate_in = self.in_proj_z(x).reshape(batch, pos, -1, self.d_head)
        b, a = self.in_proj_b(x), self.in_proj_a(x)
        weight = self.conv1d.weight.squeeze(1)
        if conv_state is not None and pos == 1:  # one decoding step: HF's in-place update of the state
            mixed = self.kernels.conv_update(mixed, conv_state, weight, self.conv1d.bias, self.activation)
        else:
            if kv_cache is not None:
                kv_cache.conv_states[self.layer] = last_columns(mixed, self.conv_kernel)
            mixed = self.kernels.conv(mixed, weight, self.conv1d.bias, activation=self.activation)
        mixed = mixed.transpose(1, 2)
        key_dim = self.n_key_heads * self.d_key
        q, k, v = torch.split(mixed, [key_dim, key_dim, self.n_heads * self.d_head], dim=-1)
        q = self.hook_q(q.reshape(batch, pos, -1, self.d_key))
        k = self.hook_k(k.reshape(batch, pos, -1, self.d_key))
        v = self.hook_v(v.reshape(batch, pos, -1, self.d_head))
        beta = self.hook_beta(b.sigmoid())
        g = self.hook_g(-self.A_log.float().exp() * F.softplus(a.float() + self.dt_bias))

        keep_state = kv_cache is not None
        if self.state_hooked():
            core, final = self._explicit_recurrence(q, k, v, g, beta, state)
        else:
            rule = self.kernels.recurrent_rule if state is not None and pos == 1 else self.kernels.chunk_rule
            core, final = rule(q, k, v, g=g, beta=beta, initial_state=state, output_final_state=keep_state,
                               use_qk_l2norm_in_kernel=True, cu_seqlens=None)
        if kv_cache is not None:
            kv_cache.recurrent_states[self.layer] = final
            kv_cache.positions[self.layer] += pos
        core = self.hook_core_out(core)
        gate = self.hook_output_gate(F.silu(gate_in.to(torch.float32)))
        z = self.hook_z(self._gated_norm(core, gate))  # [batch, pos, n_heads, d_head]
        if self.cfg.use_attn_result:
            result = self.hook_result(torch.einsum("bphd,hdm->bphm", z, self.W_O))
            return result.sum(dim=2) + self.b_O
        return self.out_proj(z.reshape(batch, pos, -1))

    def _gated_norm(self, core: Tensor, gate: Tensor) -> Tensor:
        """HF's RMSNormGated per head: w * rmsnorm(core), times the (fp32) gate, cast back once."""
        dtype = core.dtype
        hidden = core.to(torch.float32)
        hidden = hidden * torch.rsqrt(hidden.pow(2).mean(-1, keepdim=True) + self.norm.variance_epsilon)
        hidden = self.norm.weight * hidden.to(dtype)
        return (hidden * gate).to(dtype)

    def _explicit_recurrence(self, q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor,
                             initial: Tensor | None) -> tuple[Tensor, Tensor]:
        """The token-by-token rule with every state materialised and hooked (module docstring).

        Returns (read-out [batch, pos, n_heads, d_head] in q's dtype, final state [batch, n_heads, d_key, d_head])."""
        dtype = q.dtype
        ratio = self.n_heads // self.n_key_heads
        q, k = (t.repeat_interleave(ratio, dim=2) if ratio > 1 else t for t in (q, k))
        q, k, v, beta, g = (t.transpose(1, 2).to(torch.float32) for t in (q, k, v, beta, g))
        q = q * torch.rsqrt((q * q).sum(dim=-1, keepdim=True) + 1e-6)
        k = k * torch.rsqrt((k * k).sum(dim=-1, keepdim=True) + 1e-6)
        q = q / (q.shape[-1] ** 0.5)
        batch, heads, pos, d_key = k.shape
        start = torch.zeros(batch, heads, d_key, v.shape[-1], dtype=torch.float32, device=v.device) \
            if initial is None else initial.to(v)

        def step(previous: Tensor, t: int) -> Tensor:
            decayed = previous * g[:, :, t].exp()[..., None, None]
            memory = (decayed * k[:, :, t].unsqueeze(-1)).sum(dim=-2)
            delta = (v[:, :, t] - memory) * beta[:, :, t].unsqueeze(-1)
            return decayed + k[:, :, t].unsqueeze(-1) * delta.unsqueeze(-2)

        states, current = [], start
        for t in range(pos):
            current = step(current, t)
            states.append(current)
        clean = torch.stack(states, dim=1)  # [batch, pos, heads, d_key, d_head]
        edited = self.hook_recurrent_state(clean)
        if edited is not clean:
            changed = (edited != clean).flatten(3).any(-1)  # [batch, pos, heads]
            if bool(changed.any()):
                states, current = [], start
                for t in range(pos):
                    current = torch.where(changed[:, t, :, None, None], edited[:, t].to(current), step(current, t))
                    states.append(current)
                clean = torch.stack(states, dim=1)
        read = (clean * q.transpose(1, 2).unsqueeze(-1)).sum(dim=-2)  # [batch, pos, heads, d_head]
        return read.to(dtype), clean[:, -1]


def last_columns(x: Tensor, width: int) -> Tensor:
    """x [batch, channels, pos] -> its last `width` columns, zeros on the left when pos < width (HF's conv state)."""
    if x.shape[-1] < width:
        x = F.pad(x, (width - x.shape[-1], 0))
    return x[..., -width:].clone()

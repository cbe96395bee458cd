"""Llama 4's decoder pieces, numerically HF's: its rotary as (cos, sin) tables, its attention (rotary before a
weightless q / k norm; NoPE layers with attention-temperature tuning), its MoE (sigmoid top-k router, experts that
read the router-scaled token, an ungated shared expert). See `vlens.core.architectures.llama4`."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor, nn

from vlens.core.components.attention import Attention, AttentionMasks, KVCache
from vlens.core.components.mlp import GatedMLP
from vlens.core.components.moe import MoEMLP
from vlens.core.components.rotary import RotaryEmbedding, apply_rotary
from vlens.core.config import VLMConfig


class Llama4Rotary(RotaryEmbedding):
    """HF's Llama 4 rotary (complex `freqs_cis` [batch, pos, d_head / 2]) as fp32 (cos, sin) [batch, pos, d_head],
    each frequency repeated for its adjacent pair (2i, 2i + 1)."""

    def forward(self, x: Float[Tensor, "batch pos d_model"], position_ids: Int[Tensor, "batch pos"]
                ) -> tuple[Float[Tensor, "batch pos d_head"], Float[Tensor, "batch pos d_head"]]:
        freqs = self.hf_rotary(x, position_ids)
        return freqs.real.repeat_interleave(2, dim=-1), freqs.imag.repeat_interleave(2, dim=-1)


class Llama4Attention(Attention):
    """Llama 4's attention: `hook_q/k/v`, then rotary (RoPE layers, in fp32 as HF's complex product), the
    weightless q / k norm (`qk_norm_eps`, RoPE layers with `use_qk_norm`), or the temperature on NoPE layers
    (`temperature` = (attn_scale, floor_scale)); `hook_rot_q` / `hook_rot_k` are what the scores read."""

    def __init__(self, cfg: VLMConfig, layer: int, q_proj: nn.Linear, k_proj: nn.Linear, v_proj: nn.Linear,
                 o_proj: nn.Linear, qk_norm_eps: float | None = None, temperature: tuple[float, float] | None = None):
        super().__init__(cfg, layer, q_proj, k_proj, v_proj, o_proj)
        self.qk_norm_eps = qk_norm_eps
        self.temperature = temperature

    def _l2(self, x: Tensor) -> Tensor:
        eps = float(self.qk_norm_eps or 0.0)
        hidden = x.float()
        return (hidden * torch.rsqrt(hidden.pow(2).mean(-1, keepdim=True) + eps)).type_as(x)

    def query_scales(self, pos: int, kv_cache: KVCache | None, device: torch.device) -> Tensor:
        """[pos] HF's temperature of each query: 1 + attn_scale * log1p(floor((i + 1) / floor_scale)) at absolute
        sequence index i (the cache's length plus the query's index; padding counts)."""
        scale, floor_scale = self.temperature or (0.0, 1.0)
        past = 0
        if kv_cache is not None and kv_cache.keys[self.layer] is not None:
            past = kv_cache.offset(self.layer) + kv_cache.keys[self.layer].shape[1]  # type: ignore[union-attr]
        positions = torch.arange(pos, device=device) + past
        return torch.log1p(torch.floor((positions.float() + 1.0) / floor_scale)) * scale + 1.0

    def forward(
        self,
        x: Float[Tensor, "batch pos d_model"],
        cos: Float[Tensor, "batch pos d_head"],
        sin: Float[Tensor, "batch pos d_head"],
        masks: AttentionMasks,
        kv_cache: KVCache | None = None,
    ) -> Float[Tensor, "batch pos d_model"]:
        batch, pos, _ = x.shape
        d_head = self.cfg.d_head
        q = self.hook_q(self.q_proj(x).view(batch, pos, -1, d_head))
        k = self.hook_k(self.k_proj(x).view(batch, pos, -1, d_head))
        v = self.hook_v(self.v_proj(x).view(batch, pos, -1, d_head))
        if self.uses_rope:
            q = apply_rotary(q.float(), cos.float(), sin.float(), True).type_as(q)
            k = apply_rotary(k.float(), cos.float(), sin.float(), True).type_as(k)
            if self.qk_norm_eps is not None:
                q, k = self._l2(q), self._l2(k)
        elif self.temperature is not None:
            q = (q * self.query_scales(pos, kv_cache, x.device)[None, :, None, None]).to(q.dtype)
        return self.attend(self.hook_rot_q(q), self.hook_rot_k(k), v, masks, kv_cache)


class Llama4MoEMLP(MoEMLP):
    """Llama 4's `Llama4TextMoe`: logits = router(x) (`hook_router_logits`), the top-k logits' sigmoids are the
    weights (`hook_expert_weights`, fp32 then cast), each chosen expert runs on x * its weight (`hook_expert_out`:
    that output, already weighted), their sum in expert order (`hook_routed_out`), plus the shared expert
    (`hook_shared_out`, no gate). HF's experts: gate_up_proj [E, d_model, 2 d_expert], down_proj [E, d_expert, d]."""

    def __init__(self, router: nn.Module, experts: nn.Module, top_k: int, shared_expert: GatedMLP):
        super().__init__(router, experts, top_k=top_k, normalize_top_k=False, shared_expert=shared_expert,
                         ungated_shared=True)

    def expert_weights(self, expert: int) -> tuple[Tensor | None, Tensor, Tensor]:
        gate, up = self.experts.gate_up_proj[expert].chunk(2, dim=-1)
        return gate, up, self.experts.down_proj[expert]

    def route(self, x: Float[Tensor, "batch pos d_model"]) -> tuple[Tensor, Tensor, Tensor]:
        logits = self.hook_router_logits(F.linear(x, self.router.weight))
        values, indices = torch.topk(logits, self.top_k, dim=-1)
        weights = self.hook_expert_weights(torch.sigmoid(values.float()).to(logits.dtype))
        return logits, weights, self.hook_expert_indices(indices)

    def forward(self, x: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"]:
        batch, pos, d_model = x.shape
        _, weights, indices = self.route(x)
        k = indices.shape[-1]
        flat = x.reshape(-1, d_model)
        scaled = flat[:, None, :] * weights.reshape(-1, k, 1).to(x.dtype)  # [n, k, d]: HF scales the expert's input
        idx = indices.reshape(-1, k)
        out = flat.new_zeros(idx.shape[0], k, d_model)
        ex: Any = self.experts
        for expert in sorted({int(e) for e in idx.unique().tolist() if 0 <= int(e) < self.n_experts}):
            token, slot = torch.where(idx == expert)
            gate, up = (scaled[token, slot] @ ex.gate_up_proj[expert]).chunk(2, dim=-1)
            out[token, slot] = ((up * ex.act_fn(gate)) @ ex.down_proj[expert]).to(out.dtype)
        expert_out = self.hook_expert_out(out.view(batch, pos, k, d_model))
        order = indices.argsort(dim=-1, stable=True)  # HF sums the experts in increasing order
        ordered = expert_out.gather(2, order[..., None].expand_as(expert_out))
        routed = torch.zeros_like(x)
        for s in range(k):
            routed = routed + ordered[:, :, s]
        routed = self.hook_routed_out(routed)
        assert self.shared_expert is not None
        return self.hook_shared_out(self.shared_expert(x)) + routed

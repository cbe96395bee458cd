"""Grouped-query self-attention with every TransformerLens hook.

Two numerically HF-identical paths:
- the fast path calls HF's own `sdpa_attention_forward` (used while nothing hooks or caches
  `hook_attn_scores` / `hook_pattern`);
- the explicit path materialises scores and pattern exactly like HF's eager attention
  (scores + additive mask, softmax in fp32, cast back) so they can be read and edited.
"""

from __future__ import annotations

import einops
import torch
from jaxtyping import Float
from torch import Tensor, nn
from transformers.integrations.sdpa_attention import repeat_kv, sdpa_attention_forward

from vlens.core.components.rotary import apply_rotary
from vlens.core.config import VLMConfig
from vlens.core.hooks import HookPoint


class AttentionMasks:
    """One causal+padding mask in HF's two forms: sdpa's (bool or None) and eager's (additive)."""

    def __init__(self, sdpa: Tensor | None, allowed: Tensor, dtype: torch.dtype):
        self.sdpa = sdpa  # bool [batch, 1, q, k] or None (plain causal: sdpa's is_causal)
        self.allowed = allowed  # bool [batch, 1, q, k]
        self.dtype = dtype
        self._additive: Tensor | None = None
        # query rows that may attend to nothing (padding queries under left padding)
        self.fully_masked = ~allowed.any(dim=-1).squeeze(1)  # [batch, q]
        self.any_fully_masked = bool(self.fully_masked.any())
        self._query_real: Tensor | None = None
        self._query_real_known = False

    @property
    def query_real(self) -> Tensor | None:
        """bool [batch, q]: which query positions are real tokens (False at padding), None when all are.

        The last query row sees every key (causal), so its row of the padding-and-causal mask is
        the padding mask over the keys; its last q entries are the queries' (HF's 2-D
        `attention_mask[:, -q:]`, which linear-attention layers use to zero padding inputs).
        """
        if not self._query_real_known:
            real = self.allowed[:, 0, -1, -self.allowed.shape[-2]:]
            self._query_real = None if bool(real.all()) else real
            self._query_real_known = True
        return self._query_real

    def to(self, device: torch.device) -> AttentionMasks:
        """The same masks on `device` (for a block that a device map placed there)."""
        sdpa = None if self.sdpa is None else self.sdpa.to(device)
        return AttentionMasks(sdpa=sdpa, allowed=self.allowed.to(device), dtype=self.dtype)

    @property
    def additive(self) -> Tensor:
        """float [batch, 1, q, k]: 0 where allowed, the dtype's min elsewhere (HF's eager mask)."""
        if self._additive is None:
            zero = torch.zeros((), device=self.allowed.device, dtype=self.dtype)
            self._additive = torch.where(self.allowed, zero, torch.finfo(self.dtype).min)
        return self._additive


class KVCache:
    """Per-layer decoding cache.

    Softmax-attention layers: rotated keys and values, [batch, pos, n_kv_heads, d_head].
    Linear-attention layers (Gated DeltaNet): the short convolution's last inputs
    `conv_states[layer]` [batch, conv_dim, kernel] and the recurrent state
    `recurrent_states[layer]` [batch, n_heads, d_key, d_head]; `positions[layer]` counts what they have seen.
    """

    def __init__(self, n_layers: int):
        self.keys: list[Tensor | None] = [None] * n_layers
        self.values: list[Tensor | None] = [None] * n_layers
        self.conv_states: list[Tensor | None] = [None] * n_layers
        self.recurrent_states: list[Tensor | None] = [None] * n_layers
        self.positions: list[int] = [0] * n_layers

    @property
    def length(self) -> int:
        """Positions already cached (the first layer that holds anything)."""
        for keys, seen in zip(self.keys, self.positions, strict=True):
            if keys is not None:
                return keys.shape[1]
            if seen:
                return seen
        return 0

    def update(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        past_k, past_v = self.keys[layer], self.values[layer]
        if past_k is not None and past_v is not None:
            k = torch.cat([past_k, k], dim=1)
            v = torch.cat([past_v, v], dim=1)
        self.keys[layer], self.values[layer] = k, v
        return k, v


class Attention(nn.Module):
    """Self-attention of one decoder layer.

    The projections are the HF `nn.Linear` modules themselves (so PEFT's LoRA targets
    `q_proj`/`k_proj`/`v_proj`/`o_proj` here exactly as on the HF model).
    """

    def __init__(
        self,
        cfg: VLMConfig,
        layer: int,
        q_proj: nn.Linear,
        k_proj: nn.Linear,
        v_proj: nn.Linear,
        o_proj: nn.Linear,
        q_norm: nn.Module | None = None,
        k_norm: nn.Module | None = None,
    ):
        super().__init__()
        self.cfg = cfg
        self.layer = layer
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = q_proj, k_proj, v_proj, o_proj
        self.q_norm, self.k_norm = q_norm, k_norm
        self.scaling = cfg.d_head**-0.5
        # read by HF's sdpa_attention_forward
        self.num_key_value_groups = cfg.n_heads // cfg.n_key_value_heads
        self.is_causal = True

        self.hook_q = HookPoint()  # [batch, pos, n_heads, d_head]
        self.hook_k = HookPoint()  # [batch, pos, n_key_value_heads, d_head]
        self.hook_v = HookPoint()  # [batch, pos, n_key_value_heads, d_head]
        self.hook_rot_q = HookPoint()  # [batch, pos, n_heads, d_head] after (q norm and) rotary
        self.hook_rot_k = HookPoint()  # [batch, pos, n_key_value_heads, d_head]
        self.hook_attn_scores = HookPoint()  # [batch, n_heads, query_pos, key_pos]
        self.hook_pattern = HookPoint()  # [batch, n_heads, query_pos, key_pos]
        self.hook_z = HookPoint()  # [batch, pos, n_heads, d_head]
        self.hook_result = HookPoint()  # [batch, pos, n_heads, d_model]
        self.hook_pattern.pos_dim = -2
        self.hook_attn_scores.pos_dim = -2

    # ---- TransformerLens-shaped weight views (views of the HF parameters, no copies) ----
    def _split_in(self, linear: nn.Linear, n: int) -> Tensor:
        return einops.rearrange(linear.weight, "(n h) m -> n m h", n=n)

    def _split_bias(self, linear: nn.Linear, n: int) -> Tensor:
        if linear.bias is None:
            return torch.zeros(n, self.cfg.d_head, dtype=linear.weight.dtype, device=linear.weight.device)
        return einops.rearrange(linear.bias, "(n h) -> n h", n=n)

    @property
    def W_Q(self) -> Float[Tensor, "n_heads d_model d_head"]:
        return self._split_in(self.q_proj, self.cfg.n_heads)

    @property
    def _W_K(self) -> Float[Tensor, "n_kv_heads d_model d_head"]:
        return self._split_in(self.k_proj, self.cfg.n_key_value_heads)

    @property
    def _W_V(self) -> Float[Tensor, "n_kv_heads d_model d_head"]:
        return self._split_in(self.v_proj, self.cfg.n_key_value_heads)

    @property
    def W_K(self) -> Float[Tensor, "n_heads d_model d_head"]:
        return self._W_K.repeat_interleave(self.num_key_value_groups, dim=0)

    @property
    def W_V(self) -> Float[Tensor, "n_heads d_model d_head"]:
        return self._W_V.repeat_interleave(self.num_key_value_groups, dim=0)

    @property
    def W_O(self) -> Float[Tensor, "n_heads d_head d_model"]:
        return einops.rearrange(self.o_proj.weight, "m (n h) -> n h m", n=self.cfg.n_heads)

    @property
    def b_Q(self) -> Float[Tensor, "n_heads d_head"]:
        return self._split_bias(self.q_proj, self.cfg.n_heads)

    @property
    def _b_K(self) -> Float[Tensor, "n_kv_heads d_head"]:
        return self._split_bias(self.k_proj, self.cfg.n_key_value_heads)

    @property
    def _b_V(self) -> Float[Tensor, "n_kv_heads d_head"]:
        return self._split_bias(self.v_proj, self.cfg.n_key_value_heads)

    @property
    def b_K(self) -> Float[Tensor, "n_heads d_head"]:
        return self._b_K.repeat_interleave(self.num_key_value_groups, dim=0)

    @property
    def b_V(self) -> Float[Tensor, "n_heads d_head"]:
        return self._b_V.repeat_interleave(self.num_key_value_groups, dim=0)

    @property
    def b_O(self) -> Float[Tensor, "d_model"]:
        if self.o_proj.bias is not None:
            return self.o_proj.bias
        return torch.zeros(self.cfg.d_model, dtype=self.o_proj.weight.dtype, device=self.o_proj.weight.device)

    # ---- forward ----
    def needs_pattern(self) -> bool:
        """True when a hook (or cache) is attached to the scores or the pattern."""
        return bool(self.hook_attn_scores.fwd_hooks or self.hook_pattern.fwd_hooks
                    or self.hook_attn_scores.bwd_hooks or self.hook_pattern.bwd_hooks)

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
        q, gate = self.project_queries(x)
        q = self.hook_q(q)
        k = self.hook_k(self.k_proj(x).view(batch, pos, -1, d_head))
        v = self.hook_v(self.v_proj(x).view(batch, pos, -1, d_head))
        if self.q_norm is not None and self.k_norm is not None:
            q = self.q_norm(q)
            k = self.k_norm(k)
        q = self.hook_rot_q(apply_rotary(q, cos, sin))
        k = self.hook_rot_k(apply_rotary(k, cos, sin))
        if kv_cache is not None:
            k, v = kv_cache.update(self.layer, k, v)

        q_t, k_t, v_t = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        if self.needs_pattern():
            z = self._explicit_attention(q_t, k_t, v_t, masks)
        else:
            z, _ = sdpa_attention_forward(self, q_t, k_t, v_t, masks.sdpa, dropout=0.0, scaling=self.scaling)
            if masks.any_fully_masked:
                z = _eager_fully_masked_rows(z, v_t, masks, self.num_key_value_groups)
        z = self.hook_z(self.gate_heads(z, gate))  # [batch, pos, n_heads, d_head]

        if self.cfg.use_attn_result:
            result = self.hook_result(torch.einsum("bphd,hdm->bphm", z, self.W_O))
            return result.sum(dim=2) + self.b_O
        return self.o_proj(z.reshape(batch, pos, -1))

    def project_queries(self, x: Tensor) -> tuple[Tensor, Tensor | None]:
        """(queries [batch, pos, n_heads, d_head], an output gate or None) from the block's normed input.
        Plain attention has no gate; `GatedAttention` (Qwen3.5) splits its gate off q_proj's output."""
        batch, pos, _ = x.shape
        return self.q_proj(x).view(batch, pos, -1, self.cfg.d_head), None

    def gate_heads(self, z: Tensor, gate: Tensor | None) -> Tensor:
        """The per-head output o_proj reads: z itself (GatedAttention multiplies it by its gate)."""
        return z

    def _explicit_attention(self, q: Tensor, k: Tensor, v: Tensor, masks: AttentionMasks) -> Tensor:
        """HF eager attention with hooks on the scores and the pattern. q,k,v: [batch, heads, pos, d]."""
        k = repeat_kv(k, self.num_key_value_groups)
        v = repeat_kv(v, self.num_key_value_groups)
        scores = torch.matmul(q, k.transpose(2, 3)) * self.scaling + masks.additive
        scores = self.hook_attn_scores(scores)
        # An edit (say a temperature) must never unmask: masked entries go back to the mask value.
        scores = scores.masked_fill(~masks.allowed, torch.finfo(scores.dtype).min)
        pattern = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
        pattern = self.hook_pattern(pattern)
        return torch.matmul(pattern, v).transpose(1, 2).contiguous()


def _eager_fully_masked_rows(z: Tensor, v: Tensor, masks: AttentionMasks, n_groups: int) -> Tensor:
    """Give padding queries that see no key what HF eager gives them: a uniform average of all values.

    Eager adds the dtype's minimum to every score of such a row, so softmax is uniform; SDPA
    returns zeros there instead. Real tokens never attend to padding, so this only keeps the
    padding positions identical to HF eager (what the parity suite compares).
    z: [batch, q, heads, d]; v: [batch, kv_heads, k, d].
    """
    mean_v = repeat_kv(v, n_groups).mean(dim=2)  # [batch, heads, d]
    rows = masks.fully_masked[:, :, None, None]
    return torch.where(rows, mean_v.unsqueeze(1).to(z.dtype), z)

"""Gemma 4's own decoder pieces (`gemma4.py` assembles them around the HF parameters).

- `Gemma4Attention`: Gemma 3's attention plus a scale-free RMSNorm on the values (HF's `v_norm`), a head size
  and key/value head count per layer (full-attention layers: `global_head_dim`), values equal to the keys'
  projection where HF shares them (`attention_k_eq_v`), and full-attention layers that stay causal over image
  tokens (only the sliding layers see an image bidirectionally, HF's `create_masks_for_vision_model`).
- `PerLayerInputBlock`: the sandwich block plus the per-layer-embedding (PLE) sublayer and the layer scalar;
  `DenseAndExperts`: the routed experts HF's MoE layers add beside the dense MLP.
- `Gemma4Tables`: the run's per-position tables: each layer type's rotary cos / sin (padded to the widest)
  followed by every layer's per-layer input, so that whatever repeats or slices the rotary tables by batch
  and position (patching, ablation, decoding) carries the per-layer inputs along.
- `PerLayerEmbed`: the main embedding; it also looks up the token-identity half of the per-layer inputs,
  which the tables pick up in the same forward (the context half needs the image-merged embeddings).
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

import torch
from jaxtyping import Float, Int
from torch import Tensor, nn
from torch.nn import functional as F

from vlens.core.components import (
    Attention,
    LayerTypeRotary,
    SandwichBlock,
    ScaledEmbed,
    Unembed,
    ZeroCenteredRMSNorm,
)
from vlens.core.components.attention import AttentionMasks, KVCache
from vlens.core.components.rms_norm import compute_weight
from vlens.core.components.rotary import apply_rotary
from vlens.core.config import VLMConfig
from vlens.core.hooks import HookPoint, thread_token
from vlens.utils.errors import UserInputError

_PENDING = threading.local()  # the token-identity per-layer inputs between embed and tables, per thread
_CAUSAL: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_PASS = threading.local()  # per thread: the pass through the blocks in progress (id) and its last block


def note_block(layer: int) -> int:
    """Called by every Gemma 4 block as it starts: the id of the pass through the blocks it belongs to. A block
    whose layer is not after the previous block's starts a new pass (a forward, a decoding step, a run resumed
    at a later layer after other runs)."""
    last = getattr(_PASS, "last", None)
    if last is None or layer <= last:
        _PASS.id = getattr(_PASS, "id", 0) + 1
    _PASS.last = layer
    return _PASS.id


class Fp32RMSNorm(ZeroCenteredRMSNorm):
    """w * x / sqrt(mean(x^2) + eps) in fp32, cast back once (HF's `Gemma4RMSNorm`: a plain weight, not 1 + w)."""

    @property
    def effective_weight(self) -> Tensor:
        return compute_weight(self.w, self.source)

    def forward(self, x: Float[Tensor, "... d"]) -> Float[Tensor, "... d"]:
        hidden = super(ZeroCenteredRMSNorm, self).forward(x)  # fp32, x / scale
        return (hidden * compute_weight(self.w, self.source).float()).type_as(x)


class SoftcapUnembed(Unembed):
    """The final norm's weight in fp32 (Gemma 4's norm), lm_head, then HF's soft cap ``c * tanh(logits / c)``."""

    def __init__(self, lm_head: nn.Linear, norm: Any, softcap: float | None):
        super().__init__(lm_head, norm.weight, ln_final_source=norm, ln_final_offset=0.0)
        self.softcap = softcap

    def apply_norm_weight(self, x: Float[Tensor, "... d_model"]) -> Float[Tensor, "... d_model"]:
        if self.ln_final_w is None:
            raise RuntimeError("Gemma 4's unembedding applies its final norm's weight; it has none")
        weight = compute_weight(self.ln_final_w, self.__dict__["ln_final_source"]).float()
        return (x.float() * weight.to(x.device)).to(self.lm_head.weight.dtype)

    def forward(self, x: Float[Tensor, "... d_model"]) -> Float[Tensor, "... d_vocab"]:
        logits = self.lm_head(self.apply_norm_weight(x))
        if self.softcap is None:
            return logits
        return torch.tanh(logits / self.softcap) * self.softcap


class PerLayerEmbed(ScaledEmbed):
    """Gemma's scaled embedding of the tokens with every multimodal placeholder (image, video, audio) read as
    the pad token, as HF does (the image features then overwrite the image ones); with per-layer embeddings it
    also looks up their token-identity half (HF's `get_per_layer_inputs`) for `Gemma4Tables`."""

    def __init__(self, embedding: nn.Embedding, text_model: nn.Module | None, placeholder_ids: list[int],
                 pad_id: int):
        super().__init__(embedding, placeholder_id=placeholder_ids[0] if placeholder_ids else None)
        self.__dict__["text_model"] = text_model  # HF's Gemma4TextModel (its PLE table is ours already)
        self.placeholder_ids = list(placeholder_ids)
        self.pad_id = pad_id

    def forward(self, tokens: Int[Tensor, "batch pos"]) -> Float[Tensor, "batch pos d_model"]:
        ids = tokens
        if self.placeholder_ids:
            placeholders = torch.tensor(self.placeholder_ids, device=tokens.device)
            ids = tokens.masked_fill(torch.isin(tokens, placeholders), self.pad_id)
        text_model = self.__dict__["text_model"]
        if text_model is not None:
            _PENDING.tokens = text_model.get_per_layer_inputs(ids, None)
        return self.embedding(ids)  # HF's module applies the scale


class Gemma4Tables(LayerTypeRotary):
    """(cos, sin), each [batch, pos, n_types + n_layers, width]: the layer types' rotary tables (zero-padded
    to `width`), then each layer's per-layer input (HF's `project_per_layer_inputs` of the image-merged
    embeddings and the token-identity half `PerLayerEmbed` looked up), zero-padded likewise."""

    def __init__(self, hf_rotary: nn.Module, layer_types: list[str], width: int, text_model: nn.Module | None):
        super().__init__(hf_rotary, layer_types)
        self.width = width
        self.__dict__["text_model"] = text_model

    def forward(
        self,
        x: Float[Tensor, "batch pos d_model"],
        position_ids: Int[Tensor, "... batch pos"],
    ) -> tuple[Float[Tensor, "batch pos n_tables width"], Float[Tensor, "batch pos n_tables width"]]:
        batch, pos = x.shape[:2]
        tables = [self.hf_rotary(x, position_ids, layer_type) for layer_type in self.layer_types]
        cos = [F.pad(c, (0, self.width - c.shape[-1])).expand(batch, pos, -1) for c, _ in tables]
        sin = [F.pad(s, (0, self.width - s.shape[-1])).expand(batch, pos, -1) for _, s in tables]
        cos_t, sin_t = torch.stack(cos, dim=2), torch.stack(sin, dim=2)
        text_model = self.__dict__["text_model"]
        if text_model is None:
            return cos_t, sin_t
        tokens = getattr(_PENDING, "tokens", None)
        _PENDING.tokens = None
        if tokens is None or tuple(tokens.shape[:2]) != (batch, pos):
            raise RuntimeError("Gemma 4's per-layer inputs need the embedding of the same tokens first "
                               "(model.embed, then model.rotary, in one forward)")
        per_layer = text_model.project_per_layer_inputs(x, tokens.to(x.device))  # [batch, pos, n_layers, dim]
        per_layer = F.pad(per_layer, (0, self.width - per_layer.shape[-1])).to(cos_t.dtype)
        return torch.cat([cos_t, per_layer], dim=2), torch.cat([sin_t, per_layer], dim=2)


def causal_only(masks: AttentionMasks) -> AttentionMasks:
    """`masks` without the bidirectional image blocks (HF's full-attention layers: causal and padding only)."""
    if masks.blocks is None:
        return masks
    cached = _CAUSAL.get(masks)
    if cached is None:
        q_len, kv_len = masks.allowed.shape[-2:]
        device = masks.allowed.device
        queries = torch.arange(kv_len - q_len, kv_len, device=device)
        band = torch.arange(kv_len, device=device)[None, :] <= queries[:, None]
        allowed = masks.allowed & band
        cached = AttentionMasks(sdpa=allowed, allowed=allowed, dtype=masks.dtype)
        _CAUSAL[masks] = cached
    return cached


class Gemma4Attention(Attention):
    """Gemma 4's attention (module docstring). Hooks as `Attention`'s; `hook_k` is before the key norm (as in
    Gemma 3 and Qwen3), `hook_v` after the scale-free value norm (the values each head's pattern averages:
    z_h = pattern_h @ v); with `attention_k_eq_v` the values are the value-normed key projection."""

    values_from_keys: bool

    def __init__(self, cfg: VLMConfig, layer: int, hf_attn: Any, bidirectional_images: bool,
                 kv_source: Gemma4Attention | None = None):
        """kv_source: for a KV-shared layer (HF's `num_kv_shared_layers`), the earlier layer of its type whose
        rotated keys and values it reads; it has no key / value projections of its own, so its W_K / W_V views
        are that layer's (the keys it reads were made from that layer's input)."""
        own = hf_attn if kv_source is None else kv_source
        values_from_keys = own.values_from_keys if isinstance(own, Gemma4Attention) else own.v_proj is None
        super().__init__(cfg, layer, hf_attn.q_proj, own.k_proj, own.k_proj if values_from_keys else own.v_proj,
                         hf_attn.o_proj, q_norm=hf_attn.q_norm, k_norm=own.k_norm)
        self.v_norm: nn.Module = own.v_norm
        self.values_from_keys = values_from_keys
        self.d_head = cfg.d_head_at(layer)
        self.n_kv_heads = cfg.kv_heads_at(layer)
        self.num_key_value_groups = cfg.n_heads // self.n_kv_heads
        self.causal_over_images = bidirectional_images and self.sliding_window is None
        self.__dict__["kv_source"] = kv_source  # not a submodule: its parameters are already in the model
        if kv_source is not None:
            # no keys of its own before the norm and rotary: hook_rot_k / hook_v show the shared ones it reads
            del self.hook_k
        self.shares_kv = False  # set on a layer whose keys and values later layers read
        self._shared: dict = {}  # thread -> (pass id, rotated keys, values, offset of the first key)

    # weight views with this layer's own head size and key/value head count
    def _split_bias(self, linear: nn.Linear, n: int) -> Tensor:
        if linear.bias is None:
            return torch.zeros(n, self.d_head, dtype=linear.weight.dtype, device=linear.weight.device)
        return linear.bias.view(n, self.d_head)

    @property
    def _W_K(self) -> Float[Tensor, "n_kv_heads d_model d_head"]:
        return self._split_in(self.k_proj, self.n_kv_heads)

    @property
    def _W_V(self) -> Float[Tensor, "n_kv_heads d_model d_head"]:
        return self._split_in(self.v_proj, self.n_kv_heads)

    @property
    def _b_K(self) -> Float[Tensor, "n_kv_heads d_head"]:
        return self._split_bias(self.k_proj, self.n_kv_heads)

    @property
    def _b_V(self) -> Float[Tensor, "n_kv_heads d_head"]:
        return self._split_bias(self.v_proj, self.n_kv_heads)

    def project_queries(self, x: Tensor) -> tuple[Tensor, Tensor | None]:
        return self.q_proj(x).view(*x.shape[:2], -1, self.d_head), None

    def rotary_tables(self, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
        cos, sin = super().rotary_tables(cos, sin)
        return cos[..., :self.d_head], sin[..., :self.d_head]

    def layer_masks(self, masks: AttentionMasks, kv_offset: int = 0) -> AttentionMasks:
        return super().layer_masks(causal_only(masks) if self.causal_over_images else masks, kv_offset)

    def forward(
        self,
        x: Float[Tensor, "batch pos d_model"],
        cos: Tensor,
        sin: Tensor,
        masks: AttentionMasks,
        kv_cache: KVCache | None = None,
    ) -> Float[Tensor, "batch pos d_model"]:
        batch, pos, _ = x.shape
        q, _ = self.project_queries(x)
        q = self.hook_q(q)
        if self.q_norm is None or self.k_norm is None:
            raise RuntimeError("Gemma 4's attention normalizes queries and keys")
        q = self.q_norm(q)
        cos, sin = self.rotary_tables(cos, sin)
        q = self.hook_rot_q(apply_rotary(q, cos, sin))
        source = self.__dict__["kv_source"]
        if source is not None:  # a KV-shared layer: the keys / values its source layer made in this pass
            k, v, kv_offset = source.shared_kv(self.layer)
            # through this layer's own hooks: what it reads (an edit here changes this layer only)
            return self.attend(q, self.hook_rot_k(k), self.hook_v(v), masks, None, kv_offset=kv_offset)
        keys = self.k_proj(x).view(batch, pos, -1, self.d_head)
        k = self.hook_k(keys)
        values = keys if self.values_from_keys else self.v_proj(x).view(batch, pos, -1, self.d_head)
        # after the value norm: the values the pattern averages (z_h = pattern_h @ hook_v)
        v = self.hook_v(self.v_norm(values))
        k = self.hook_rot_k(apply_rotary(self.k_norm(k), cos, sin))
        kv_offset = 0
        if kv_cache is not None:
            k, v = kv_cache.update(self.layer, k, v)
            kv_offset = kv_cache.offset(self.layer)
        if self.shares_kv:
            self._shared[thread_token()] = (getattr(_PASS, "id", 0), k, v, kv_offset)
        return self.attend(q, k, v, masks, None, kv_offset=kv_offset)

    def shared_kv(self, reader: int) -> tuple[Tensor, Tensor, int]:
        """(rotated keys, values, offset of the first key) this layer made in the current pass, for KV-shared
        layer `reader`; a pass that did not run this layer (one resumed at a later layer) is refused."""
        entry = self._shared.get(thread_token())
        # a block recomputed in backward (gradient checkpointing) reads what the forward pass made
        recomputing = getattr(torch._C, "_current_graph_task_id", lambda: -1)() != -1
        if entry is None or (entry[0] != getattr(_PASS, "id", 0) and not recomputing):
            raise UserInputError(
                f"layer {reader} of this Gemma 4 model reads the keys and values of layer {self.layer} (KV sharing, "
                f"num_kv_shared_layers), which this run did not compute: start the run at layer {self.layer} or "
                "earlier (start_at_layer / a sweep that resumes at a later layer cannot run KV-shared layers)")
        return entry[1], entry[2], entry[3]


class DenseAndExperts(nn.Module):
    """Gemma 4's mixture-of-experts layer beside the dense MLP (HF's `enable_moe_block`): HF's own router and
    experts, hooked.

        dense_out  = post_feedforward_layernorm_1(mlp(ln2(resid)))
        expert_out = post_feedforward_layernorm_2(experts(pre_feedforward_layernorm_2(resid), routing))
        routing    = router(resid): softmax over experts of a scale-free-normed, scaled projection, top-k,
                     renormalized, times each chosen expert's `per_expert_scale`

    and the block's ln2_post reads ``dense_out + expert_out``. Hooks: `hook_router_probs` [batch, pos, n_experts],
    `hook_expert_weights` / `hook_expert_indices` [batch, pos, k] (the weights as the experts read them),
    `hook_dense_out` and `hook_expert_out` [batch, pos, d_model].
    """

    def __init__(self, hf_layer: Any):
        super().__init__()
        self.router, self.experts = hf_layer.router, hf_layer.experts
        self.post_dense_norm = hf_layer.post_feedforward_layernorm_1
        self.pre_experts_norm = hf_layer.pre_feedforward_layernorm_2
        self.post_experts_norm = hf_layer.post_feedforward_layernorm_2
        self.hook_router_probs = HookPoint()
        self.hook_expert_weights = HookPoint()
        self.hook_expert_indices = HookPoint()
        self.hook_dense_out = HookPoint()
        self.hook_expert_out = HookPoint()

    def forward(self, resid: Float[Tensor, "batch pos d_model"],
                dense: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"]:
        batch, pos, d_model = resid.shape
        flat = resid.reshape(-1, d_model)
        probs, weights, indices = self.router(flat)
        self.hook_router_probs(probs.view(batch, pos, -1))
        weights = self.hook_expert_weights(weights.view(batch, pos, -1)).reshape(batch * pos, -1)
        indices = self.hook_expert_indices(indices.view(batch, pos, -1)).reshape(batch * pos, -1)
        experts = self.experts(self.pre_experts_norm(flat), indices, weights).reshape(batch, pos, d_model)
        dense_out = self.hook_dense_out(self.post_dense_norm(dense))
        return dense_out + self.hook_expert_out(self.post_experts_norm(experts))


class PerLayerInputBlock(SandwichBlock):
    """Gemma 4's block: the sandwich block, then (with per-layer embeddings) the PLE sublayer, then the
    layer scalar:

        resid_mid + mlp_out  ->  + ple_out  ->  * layer_scalar  ->  hook_resid_post
        ple_out = post_per_layer_input_norm(per_layer_projection(act(per_layer_input_gate(x)) * per_layer_input))

    `hook_per_layer_input` [batch, pos, ple_dim] is this layer's per-layer input, `hook_ple_out`
    [batch, pos, d_model] what the sublayer adds. With a layer scalar other than 1 the residual stream is
    no longer the plain sum of what the sublayers write (methods that rely on it check and refuse).
    """

    def __init__(self, layer: int, parts: dict, hf_layer: Any, table_index: int | None,
                 ple_norm: nn.Module | None):
        super().__init__(layer, **parts)
        # the experts beside the dense MLP (HF's enable_moe_block), read from the residual itself
        self.moe = DenseAndExperts(hf_layer) if getattr(hf_layer, "enable_moe_block", False) else None
        self.table_index = table_index  # where this layer's per-layer input sits in the run's tables
        self.ple_gate = getattr(hf_layer, "per_layer_input_gate", None) if table_index is not None else None
        self.ple_proj = getattr(hf_layer, "per_layer_projection", None) if table_index is not None else None
        self.ple_act: Any = getattr(hf_layer, "act_fn", None)
        self.ple_norm = ple_norm
        self.ple_dim = 0 if self.ple_gate is None else self.ple_gate.out_features
        self.__dict__["hf_layer"] = hf_layer  # its layer_scalar buffer (read at each call: moved with the model)
        self.hook_per_layer_input = HookPoint()  # [batch, pos, ple_dim]
        self.hook_ple_out = HookPoint()  # [batch, pos, d_model]

    @property
    def layer_scalar(self) -> Tensor:
        return self.__dict__["hf_layer"].layer_scalar

    def forward(
        self,
        resid: Float[Tensor, "batch pos d_model"],
        cos: Tensor,
        sin: Tensor,
        masks: AttentionMasks,
        kv_cache: KVCache | None = None,
        deepstack: tuple[Tensor, Tensor] | None = None,
    ) -> Float[Tensor, "batch pos d_model"]:
        if deepstack is not None:
            raise RuntimeError(f"block {self.layer} takes no DeepStack features (Gemma 4)")
        note_block(self.layer)
        resid = self.hook_resid_pre(resid)
        attn_out = self.hook_attn_out(self.ln1_post(self.attn(self.ln1(resid), cos, sin, masks, kv_cache)))
        resid = self.hook_resid_mid(resid + attn_out)
        dense = self.mlp(self.ln2(resid))
        mlp_out = self.hook_mlp_out(self.ln2_post(dense if self.moe is None else self.moe(resid, dense)))
        resid = resid + mlp_out
        if self.ple_gate is not None and self.ple_proj is not None and self.ple_norm is not None:
            per_layer = self.hook_per_layer_input(cos[:, :, self.table_index, :self.ple_dim])
            hidden = self.ple_proj(self.ple_act(self.ple_gate(resid)) * per_layer)
            resid = resid + self.hook_ple_out(self.ple_norm(hidden))
        return self.hook_resid_post(resid * self.layer_scalar)

"""Grouped-query self-attention with every TransformerLens hook.

Two numerically HF-identical paths:
- the fast path calls HF's own `sdpa_attention_forward` (used while nothing hooks or caches
  `hook_attn_scores` / `hook_pattern`);
- the explicit path materialises scores and pattern exactly like HF's eager attention
  (scores + additive mask, softmax in fp32, cast back) so they can be read and edited.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import einops
import torch
from jaxtyping import Bool, Float
from torch import Tensor, nn
from transformers.integrations.sdpa_attention import repeat_kv, sdpa_attention_forward

from vlens.core.components.rotary import apply_rotary
from vlens.core.config import VLMConfig
from vlens.core.hooks import HookPoint, ThreadToken, is_observed, thread_token


class AttentionMasks:
    """One attention mask in HF's two forms: sdpa's (bool or None) and eager's (additive).

    blocks: [batch, kv_len] the bidirectional block of each key position (-1: causal only) when
    the mask was built with them (Gemma 3: an image's tokens see each other), else None. Code that
    rebuilds a mask for other query rows or a repeated batch passes them on (`runtime.build_masks`).
    """

    def __init__(self, sdpa: Tensor | None, allowed: Tensor, dtype: torch.dtype, blocks: Tensor | None = None):
        self.sdpa = sdpa  # bool [batch, 1, q, k] or None (plain causal: sdpa's is_causal)
        self.allowed = allowed  # bool [batch, 1, q, k]
        self.dtype = dtype
        self.blocks = blocks  # [batch, kv_len] or None
        self._additive: Tensor | None = None
        self._windowed: dict[tuple[int, int], AttentionMasks] = {}
        self._reach: list[int] | None = None
        # query rows that may attend to nothing (padding queries under left padding)
        self.fully_masked = ~allowed.any(dim=-1).squeeze(1)  # [batch, q]
        self.any_fully_masked = bool(self.fully_masked.any())
        self._query_real: Tensor | None = None
        self._query_real_known = False
        self._causal_keys: Tensor | None = None
        self._causal_keys_known = False

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

    @property
    def causal_keys(self) -> Tensor | None:
        """bool [batch, k]: the keys of each row when this mask is exactly the causal mask AND-ed with them (a
        plain causal mask: all True; left or right padding: the padding mask), else None (image blocks, a
        window that cuts, a knockout, a decoding step). For a square mask (the queries are the keys); checked
        once per mask, on its bool form, by rebuilding it (what `causal_scores` may then assume)."""
        if not self._causal_keys_known:
            q_len, kv_len = self.allowed.shape[-2:]
            keys = None
            if q_len == kv_len and self.allowed.shape[1] == 1:
                keys = self.allowed[:, 0, -1, :]  # the last query reads every key its row keeps
                causal = torch.ones(q_len, kv_len, dtype=torch.bool, device=keys.device).tril_()
                if not torch.equal(self.allowed[:, 0], causal & keys[:, None, :]):
                    keys = None
            self._causal_keys, self._causal_keys_known = keys, True
        return self._causal_keys

    def to(self, device: torch.device) -> AttentionMasks:
        """The same masks on `device` (for a block that a device map placed there)."""
        sdpa = None if self.sdpa is None else self.sdpa.to(device)
        blocks = None if self.blocks is None else self.blocks.to(device)
        return AttentionMasks(sdpa=sdpa, allowed=self.allowed.to(device), dtype=self.dtype, blocks=blocks)

    def restricted(self, allowed: Tensor) -> AttentionMasks:
        """These masks with some entries no longer allowed (an attention knockout, `vlens.flow`).

        allowed: bool [batch, 1 or n_heads, q, k], a subset of `self.allowed` that leaves no query row
        empty that was not (the caller checks); a per-head mask broadcasts over SDPA's heads. Which
        queries are padding (`fully_masked`, `query_real`) stays what the unedited mask says.
        """
        edited = AttentionMasks(sdpa=allowed, allowed=allowed, dtype=self.dtype, blocks=self.blocks)
        edited.fully_masked, edited.any_fully_masked = self.fully_masked, self.any_fully_masked
        edited._query_real, edited._query_real_known = self.query_real, True
        return edited

    @property
    def additive(self) -> Tensor:
        """float [batch, 1, q, k]: 0 where allowed, the dtype's min elsewhere (HF's eager mask)."""
        if self._additive is None:
            zero = torch.zeros((), device=self.allowed.device, dtype=self.dtype)
            self._additive = torch.where(self.allowed, zero, torch.finfo(self.dtype).min)
        return self._additive

    def windowed(self, window: int, kv_offset: int = 0) -> AttentionMasks:
        """This mask in a sliding-window layer: a query at position i also needs key j > i - window
        (HF's sliding overlay, AND-ed with everything else, image blocks included), over the keys
        from absolute position `kv_offset` on (a KV cache that keeps only the window holds no more).

        The queries are the mask's last q_len positions (a prefill, a decoding step, a suffix run
        after a cached prefix). Built once per (window, offset) and kept.
        """
        key = (window, kv_offset)
        if key not in self._windowed:
            q_len, kv_len = self.allowed.shape[-2:]
            device = self.allowed.device
            queries = torch.arange(kv_len - q_len, kv_len, device=device)
            keys = torch.arange(kv_offset, kv_len, device=device)
            band = keys[None, :] > queries[:, None] - window  # [q, kept keys]
            if kv_offset == 0 and bool(band.all()):
                self._windowed[key] = self  # the window cuts nothing here
            else:
                allowed = self.allowed[..., kv_offset:] & band
                self._windowed[key] = AttentionMasks(sdpa=allowed, allowed=allowed, dtype=self.dtype)
        return self._windowed[key]

    def chunked(self, chunk: int, kv_offset: int = 0) -> AttentionMasks:
        """This mask in a chunked-attention layer (Llama 4): a query also needs its key in the same chunk of
        `chunk` tokens, chunks counted from the row's first real token (HF's `chunked_overlay` with left
        padding), over the keys from absolute position `kv_offset` on. Built once per (chunk, offset)."""
        key = (-chunk, kv_offset)
        if key not in self._windowed:
            q_len, kv_len = self.allowed.shape[-2:]
            device = self.allowed.device
            # left padding per row: the keys the last query (a real token, reading every earlier key) may not read
            left = (~self.allowed[:, 0, -1, :]).long().cumprod(dim=-1).sum(dim=-1)[:, None, None]  # [batch, 1, 1]
            queries = torch.arange(kv_len - q_len, kv_len, device=device)[None, :, None]
            keys = torch.arange(kv_offset, kv_len, device=device)[None, None, :]
            same = torch.div(keys - left, chunk, rounding_mode="floor") == \
                torch.div(queries - left, chunk, rounding_mode="floor")  # [batch, q, kept keys]
            allowed = self.allowed[..., kv_offset:] & same[:, None]
            self._windowed[key] = AttentionMasks(sdpa=allowed, allowed=allowed, dtype=self.dtype)
        return self._windowed[key]

    def first_affected(self, position: int) -> int:
        """The first query position whose output can change when the key at `position` changes.

        Follows attention reads through the layers (a query that reads a changed key changes, and
        so does a later layer's query that reads it): `position` itself under a causal mask, the
        first token of its image block under Gemma 3's bidirectional image blocks. No position
        before the one returned reads a key at or after it, so a run may keep those positions'
        clean activations. Over every row of the batch; for the square mask of a whole sequence.
        """
        if self._reach is None:
            reads = self.allowed.any(dim=0)[0]  # [q, k]: some row's query q reads key k
            columns = torch.arange(reads.shape[-1], device=reads.device)
            # the first query that reads each key (the key's own position when none does: padding)
            first = torch.where(reads.any(dim=0), reads.int().argmax(dim=0), columns)
            first = torch.minimum(first, columns)
            # the earliest reader of any key at or after each position
            self._reach = torch.flip(torch.cummin(torch.flip(first, [0]), dim=0).values, [0]).tolist()
        reach = self._reach
        start = min(int(position), len(reach) - 1)
        while reach[start] < start:
            start = reach[start]
        return start


MaskEdit = Callable[[AttentionMasks, int], AttentionMasks]


class KVCache:
    """Per-layer decoding cache.

    Softmax-attention layers: rotated keys and values, [batch, pos, n_kv_heads, d_head].
    Linear-attention layers (Gated DeltaNet): the short convolution's last inputs
    `conv_states[layer]` [batch, conv_dim, kernel] and the recurrent state
    `recurrent_states[layer]` [batch, n_heads, d_key, d_head]; `positions[layer]` counts what they have seen.
    windows: per layer, a sliding window (the layer keeps only its last window - 1 keys, as HF's
    sliding cache layer does: the next query reads at most those and itself) or None (keeps all).
    """

    def __init__(self, n_layers: int, windows: Sequence[int | None] | None = None):
        self.keys: list[Tensor | None] = [None] * n_layers
        self.values: list[Tensor | None] = [None] * n_layers
        self.conv_states: list[Tensor | None] = [None] * n_layers
        self.recurrent_states: list[Tensor | None] = [None] * n_layers
        self.positions: list[int] = [0] * n_layers
        self.windows: list[int | None] = list(windows) if windows is not None else [None] * n_layers
        if len(self.windows) != n_layers:
            raise RuntimeError(f"KVCache: {len(self.windows)} windows for {n_layers} layers")
        self._dropped = [0] * n_layers  # keys a windowed layer no longer holds
        self._offsets = [0] * n_layers  # absolute position of the first key the last update returned

    @property
    def length(self) -> int:
        """Positions already cached (the first layer that holds anything; a windowed layer holds fewer keys)."""
        for layer, (keys, seen) in enumerate(zip(self.keys, self.positions, strict=True)):
            if keys is not None:
                return self._dropped[layer] + keys.shape[1]
            if seen:
                return seen
        return 0

    def offset(self, layer: int) -> int:
        """Absolute position of the first key that `update` returned for `layer` (0 unless windowed)."""
        return self._offsets[layer]

    def update(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Append this step's keys / values; returns all the keys / values this step's queries may read."""
        past_k, past_v = self.keys[layer], self.values[layer]
        if past_k is not None and past_v is not None:
            k = torch.cat([past_k, k], dim=1)
            v = torch.cat([past_v, v], dim=1)
        self._offsets[layer] = self._dropped[layer]
        window = self.windows[layer]
        keep = k.shape[1] if window is None else min(k.shape[1], max(window - 1, 0))
        drop = k.shape[1] - keep
        self.keys[layer], self.values[layer] = k[:, drop:], v[:, drop:]
        self._dropped[layer] += drop
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
        self.scaling = cfg.attn_scale if cfg.attn_scale is not None else cfg.d_head**-0.5
        self.sliding_window = cfg.attention_window(layer)  # None: every earlier key
        self.attention_chunk = cfg.attention_chunk(layer)  # Llama 4's chunked layers; None: no chunks
        self.rotary_index = cfg.rotary_index(layer)  # which of the run's rotary tables (None: the only one)
        self.uses_rope = cfg.uses_rope(layer)  # False: a NoPE layer (q and k pass unrotated)
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
        # mask edits of the thread that added them (`vlens.flow.knockout`), applied in
        # `layer_masks` after the sliding window; an edit takes (masks, kv_offset) and returns new masks
        self.mask_edits: list[tuple[ThreadToken, MaskEdit]] = []  # (the thread it applies in, the edit)

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
        return is_observed(self.hook_attn_scores) or is_observed(self.hook_pattern)

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
        if self.uses_rope:
            cos, sin = self.rotary_tables(cos, sin)
            adjacent = self.cfg.rope_adjacent_pairs
            q = apply_rotary(q, cos, sin, adjacent)
            k = apply_rotary(k, cos, sin, adjacent)
        q, k = self.hook_rot_q(q), self.hook_rot_k(k)
        return self.attend(q, k, v, masks, kv_cache, gate)

    def attend(self, q: Tensor, k: Tensor, v: Tensor, masks: AttentionMasks, kv_cache: KVCache | None,
               gate: Tensor | None = None, kv_offset: int = 0) -> Float[Tensor, "batch pos d_model"]:
        """Rotated q [batch, pos, n_heads, d], k / v [batch, pos, n_kv_heads, d] -> the layer's output: the
        KV cache, this layer's mask, softmax attention (HF's sdpa, or eager with the pattern hooks), hook_z,
        o_proj (or per-head results). `kv_offset`: the absolute position of the first key, where keys come
        from elsewhere than this layer's cache (Gemma 4's KV-shared layers)."""
        batch, pos = q.shape[:2]
        if kv_cache is not None:
            k, v = kv_cache.update(self.layer, k, v)
            kv_offset = kv_cache.offset(self.layer)
        masks = self.layer_masks(masks, kv_offset)

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

    def rotary_tables(self, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
        """This layer's (cos, sin) [batch, pos, d_head] from the run's tables: the only one, or its
        own of [batch, pos, n_kinds, d_head] where layers differ (Gemma 3's local and global bases)."""
        if self.rotary_index is None:
            if cos.ndim != 3:
                raise RuntimeError(f"layer {self.layer} reads one rotary table [batch, pos, d_head], got "
                                 f"{tuple(cos.shape)}")
            return cos, sin
        return cos[:, :, self.rotary_index], sin[:, :, self.rotary_index]

    def layer_masks(self, masks: AttentionMasks, kv_offset: int = 0) -> AttentionMasks:
        """The run's mask as this layer applies it: with its sliding window (over the keys from
        absolute position `kv_offset` on), or as it is."""
        if self.sliding_window is not None:
            masks = masks.windowed(self.sliding_window, kv_offset)
        if self.attention_chunk is not None:
            masks = masks.chunked(self.attention_chunk, kv_offset)
        if self.mask_edits:
            me = thread_token()
            for owner, edit in self.mask_edits:
                if owner is me:
                    masks = edit(masks, kv_offset)
        return masks

    def _explicit_attention(self, q: Tensor, k: Tensor, v: Tensor, masks: AttentionMasks) -> Tensor:
        """HF eager attention with hooks on the scores and the pattern. q,k,v: [batch, heads, pos, d].

        HF's arithmetic (scores * scaling + mask, softmax in fp32, cast back), done in place on the one
        [batch, heads, q, k] tensor the matmul makes wherever no hook holds it: a forward then allocates one
        such tensor per layer, the pattern, where it allocated two (on a CPU each is pages faulted in, a large
        part of what the pattern costs). On a CPU outside autograd, a causal mask over the whole sequence (padded
        or not: `AttentionMasks.causal_keys`) multiplies only the query x key blocks not all masked
        (`causal_scores`). Same bits as the plain arithmetic; the costs: benchmarks/RESULTS.md, "the explicit
        attention path".
        """
        k = repeat_kv(k, self.num_key_value_groups)
        v = repeat_kv(v, self.num_key_value_groups)
        if is_observed(self.hook_attn_scores):
            scores = self.hook_attn_scores(torch.matmul(q, k.transpose(2, 3)) * self.scaling + masks.additive)
            # An edit (say a temperature) must never unmask: masked entries go back to the mask value.
            # masked_fill makes a new tensor, which nothing else holds: the softmax may overwrite it.
            scores = scores.masked_fill(~masks.allowed, torch.finfo(scores.dtype).min)
        elif q.device.type == "cpu" and not (q.requires_grad or k.requires_grad or torch.compiler.is_compiling()) \
                and not torch.is_autocast_enabled("cpu") and masks.causal_keys is not None:
            # a causal mask over the whole sequence, with or without padding: the same scores, bit for bit,
            # from the query x key blocks that are not all masked (eager only: its checks and padding columns
            # depend on the mask's values, which a compiled graph would break on)
            scores = causal_scores(q, k, self.scaling, masks.causal_keys)
        else:  # only the pattern is read: the same arithmetic in place, no copy of the scores
            # The masked entries are written with the mask value, not added to it (adding 0 elsewhere changes
            # nothing but the sign of a zero score): min + a negative score overflows to -inf in bf16, and a
            # fully masked (padding) row would then be NaN.
            # (The product's dtype, not q's: under autocast the matmul gives bf16 from fp32 q and k.)
            scores = torch.matmul(q, k.transpose(2, 3)).mul_(self.scaling)
            scores = scores.masked_fill_(~masks.allowed, torch.finfo(scores.dtype).min)
        pattern = self.hook_pattern(eager_softmax(scores, q.dtype))
        return torch.matmul(pattern, v).transpose(1, 2).contiguous()


CAUSAL_QUERY_BLOCK = 64  # query rows per step of `causal_scores` (five torch calls a step; the work is n^2)


def causal_scores(q: Float[Tensor, "batch heads n d_head"], k: Float[Tensor, "batch heads n d_head"],
                  scaling: float, keys: Bool[Tensor, "batch n"] | None = None) -> Float[Tensor, "batch heads n n"]:
    """`(q @ k^T) * scaling` with every key after its query set to the dtype's min: HF eager's scores under a
    plain causal mask, the same tensor as the whole matmul, scaled, then masked_fill.

    Made a block of query rows at a time: each block multiplies only the keys up to its last query (the same
    dot products, about half of them in all), masks inside its diagonal block, and writes the min over the
    keys after it (no product, no pass to read them). Every block has CAUSAL_QUERY_BLOCK rows or more (the
    last takes the rest): a matmul of one or two rows takes another BLAS kernel, which rounds differently,
    while blocks of 64 rows give the whole matmul's bits (tests/unit/test_explicit_attention.py).
    q, k: the queries are the keys' positions (a prefill, not a decoding step), k repeated to the query heads.
    keys: the keys each row may read (its padding mask; `AttentionMasks.causal_keys`), None: all: the columns
    of the others are written with the min too (a padding query, which reads no key, gets a row of min, as
    under HF's mask).
    """
    n = q.shape[-2]
    lowest = torch.finfo(q.dtype).min
    scores = q.new_empty(*q.shape[:-1], n)
    k_t = k.transpose(-1, -2)
    later = torch.ones(2 * CAUSAL_QUERY_BLOCK, 2 * CAUSAL_QUERY_BLOCK, dtype=torch.bool, device=q.device).triu_(1)
    starts = list(range(0, max(n - CAUSAL_QUERY_BLOCK, 0) + 1, CAUSAL_QUERY_BLOCK))
    for start, end in zip(starts, [*starts[1:], n], strict=True):
        seen = scores[..., start:end, :end]  # the keys this block's queries may read, and the diagonal block
        torch.matmul(q[..., start:end, :], k_t[..., :end], out=seen)
        seen.mul_(scaling)
        seen[..., start:].masked_fill_(later[:end - start, :end - start], lowest)
        scores[..., start:end, end:].fill_(lowest)
    if keys is not None and not bool(keys.all()):
        for row, kept in enumerate(keys.expand(scores.shape[0], -1)):
            scores[row].index_fill_(-1, (~kept).nonzero().squeeze(-1), lowest)  # a few columns, not a pass
    return scores


def eager_softmax(scores: Float[Tensor, "batch heads query key"],
                  dtype: torch.dtype | None = None) -> Float[Tensor, "batch heads query key"]:
    """HF eager's `softmax(scores, -1, dtype=float32).to(dtype)` (dtype: the queries', default the scores'; they
    differ under autocast, where the scores are bf16 and the queries fp32), written over `scores` (which the
    caller owns) where that is the same kernel: fp32 scores and pattern on a CPU, outside autograd (an out= op
    records no graph).

    scores: [batch, heads, q, k] -> the pattern, same shape, in `dtype`.
    """
    dtype = scores.dtype if dtype is None else dtype
    if scores.dtype == dtype == torch.float32 and scores.device.type == "cpu" and not scores.requires_grad:
        return torch.softmax(scores, dim=-1, out=scores)
    return torch.softmax(scores, dim=-1, dtype=torch.float32).to(dtype)


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

"""`VLMConfig`: the shape and bookkeeping facts of a converted model.

Field names follow TransformerLens (`n_layers`, `d_model`, `n_heads`, `d_head`, ...) so that
`transformer_lens.ActivationCache` methods and TransformerLens habits carry over.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Literal

import torch

RopeKind = Literal["1d", "mrope_chunked", "mrope_interleaved"]


@dataclass
class VLMConfig:
    """Configuration of a `HookedVLM`'s language decoder plus the multimodal token ids.

    Built by the architecture adapter from the HF config; users rarely make one by hand.
    """

    architecture: str  # HF class name, e.g. "Qwen2_5_VLForConditionalGeneration"
    n_layers: int
    d_model: int
    n_heads: int
    n_key_value_heads: int
    d_head: int
    d_mlp: int
    d_vocab: int
    # token ids the embedding takes when it holds more rows than the LM head has outputs (Molmo 2's
    # additional vocabulary of image tokens); 0: d_vocab
    d_vocab_in: int = 0
    act_fn: str = "silu"
    eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_kind: RopeKind = "mrope_chunked"
    mrope_section: list[int] = field(default_factory=list)  # per (t, h, w), sums to d_head // 2
    rope_attention_scaling: float = 1.0
    # rotary pairs: dimensions (i, i + d / 2) (False: Llama / Qwen) or adjacent (2i, 2i + 1) (GLM-4V)
    rope_adjacent_pairs: bool = False
    qk_norm: bool = False  # Qwen3: per-head RMSNorm on q and k before rotary
    # the attention logits' scale (None: d_head ** -0.5; Gemma 3: query_pre_attn_scalar ** -0.5)
    attn_scale: float | None = None
    sliding_window: int | None = None  # keys a "sliding_attention" query sees, itself included
    # Llama 4's "chunked_attention" layers: a query sees the keys of its own chunk of this many tokens, counted
    # from the row's first real token (HF's `chunked_overlay`)
    attention_chunk_size: int | None = None
    # layer types with rotary tables of their own, in the order of the run's cos/sin third axis
    # (Gemma 3: a local and a global base); empty: one [batch, pos, d_head] table for every layer
    rope_layer_types: list[str] = field(default_factory=list)
    # layers whose attention applies no rotary at all (Cohere2's global layers, Llama 4's NoPE layers)
    nope_layers: list[int] = field(default_factory=list)
    attn_qkv_bias: bool = True
    attn_out_bias: bool = False
    tie_word_embeddings: bool = False
    # multimodal token ids (None where the family has no such token)
    image_token_id: int | None = None
    video_token_id: int | None = None
    vision_start_token_id: int | None = None
    vision_end_token_id: int | None = None
    pad_token_id: int | None = None
    eos_token_ids: list[int] = field(default_factory=list)
    spatial_merge_size: int = 1
    temporal_patch_size: int = 1  # video frames per token (Qwen-VL's temporal patches)
    n_deepstack_layers: int = 0
    # hybrid decoders: each layer's token mixer, HF's layer type: "full_attention" (softmax),
    # "sliding_attention" (softmax over the last `sliding_window` keys, Gemma 3) or "linear_attention"
    # (Gated DeltaNet, Qwen3.5) or "conv" (LFM2's short convolution); empty: every layer is full attention.
    # A linear-attention layer's heads are its value heads, a conv layer's groups of channels:
    # `linear_n_heads` of size `linear_d_head` (its hook_z).
    layer_types: list[str] = field(default_factory=list)
    linear_n_heads: int = 0
    linear_d_head: int = 0
    linear_n_key_heads: int = 0
    linear_d_key: int = 0
    linear_conv_kernel: int = 0
    # softmax layers whose head size / key-value head count differ by layer (Gemma 4's full-attention
    # layers: `global_head_dim`); empty: every softmax layer has d_head / n_key_value_heads
    layer_d_heads: list[int] = field(default_factory=list)
    layer_kv_heads: list[int] = field(default_factory=list)
    # dense MLP widths that differ by layer (Gemma 4's double-wide MLPs in KV-shared layers); empty: d_mlp
    layer_d_mlps: list[int] = field(default_factory=list)
    # mixture of experts (0 / empty for dense MLPs): experts per MoE layer, experts per token, the
    # layers whose MLP is a MoE block, an expert's hidden size, the shared expert's (0: none)
    n_experts: int = 0
    n_experts_per_token: int = 0
    moe_layers: list[int] = field(default_factory=list)
    d_expert: int = 0
    d_shared_expert: int = 0
    # behaviour switches
    use_attn_result: bool = False  # compute per-head `hook_result` [batch, pos, n_heads, d_model]
    model_name: str = ""
    dtype: torch.dtype = torch.float32
    device: str = "cpu"
    # TransformerLens compatibility constants (read by ActivationCache and TL utilities)
    normalization_type: str = "RMS"
    positional_embedding_type: str = "rotary"
    attn_only: bool = False
    parallel_attn_mlp: bool = False
    use_hook_mlp_in: bool = False
    n_ctx: int = 32768
    default_prepend_bos: bool = False

    @property
    def d_vocab_out(self) -> int:
        return self.d_vocab

    def is_linear_attention(self, layer: int) -> bool:
        """True when decoder layer `layer` mixes tokens without an attention pattern: linear attention
        (Gated DeltaNet, "linear_attention") or LFM2's short convolution ("conv")."""
        return bool(self.layer_types) and self.layer_types[layer] in ("linear_attention", "conv")

    def heads_at(self, layer: int) -> int:
        """Heads of decoder layer `layer` (its hook_z's head dimension)."""
        return self.linear_n_heads if self.is_linear_attention(layer) else self.n_heads

    def d_head_at(self, layer: int) -> int:
        """Size of one head's output in decoder layer `layer` (its hook_z's last dimension)."""
        if self.is_linear_attention(layer):
            return self.linear_d_head
        return self.layer_d_heads[layer] if self.layer_d_heads else self.d_head

    def d_mlp_at(self, layer: int) -> int:
        """Hidden width of decoder layer `layer`'s dense MLP (its hook_pre / hook_post's last dimension)."""
        return self.layer_d_mlps[layer] if self.layer_d_mlps else self.d_mlp

    def kv_heads_at(self, layer: int) -> int:
        """Key/value heads of softmax-attention layer `layer` (its hook_k / hook_v's head dimension)."""
        return self.layer_kv_heads[layer] if self.layer_kv_heads else self.n_key_value_heads

    @property
    def max_heads(self) -> int:
        """The most heads any layer has: the width of a [n_layers, heads] grid (NaN where a layer has fewer)."""
        return max(self.heads_at(layer) for layer in range(self.n_layers))

    @property
    def n_heads_total(self) -> int:
        """Heads in the whole decoder (every layer's own count)."""
        return sum(self.heads_at(layer) for layer in range(self.n_layers))

    @property
    def uniform_heads(self) -> bool:
        """True when every layer has the same head shape (n_heads x d_head), as in a dense decoder."""
        return all((self.heads_at(x), self.d_head_at(x)) == (self.n_heads, self.d_head) for x in range(self.n_layers))

    @property
    def linear_attention_layers(self) -> list[int]:
        """Layers whose token mixer is linear attention (Gated DeltaNet)."""
        return [x for x in range(self.n_layers) if self.is_linear_attention(x)]
    def attention_window(self, layer: int) -> int | None:
        """How many keys (itself included) a query of `layer` sees: the sliding window for a
        "sliding_attention" layer, None (every earlier key) otherwise."""
        if self.layer_types and self.layer_types[layer] == "sliding_attention":
            return self.sliding_window
        return None

    def attention_chunk(self, layer: int) -> int | None:
        """The chunk a query of `layer` attends within ("chunked_attention" layers), None elsewhere."""
        if self.layer_types and self.layer_types[layer] == "chunked_attention":
            return self.attention_chunk_size
        return None

    def uses_rope(self, layer: int) -> bool:
        """False where `layer`'s attention reads no rotary positions (`nope_layers`)."""
        return layer not in self.nope_layers

    def rotary_index(self, layer: int) -> int | None:
        """Which of the run's rotary tables `layer` reads (None: the only one)."""
        if not self.rope_layer_types:
            return None
        return self.rope_layer_types.index(self.layer_types[layer])

    @property
    def n_groups(self) -> int:
        """Query heads per key/value head (1 for plain multi-head attention)."""
        return self.n_heads // self.n_key_value_heads

    def to_dict(self) -> dict:
        out = asdict(self)
        out["dtype"] = str(self.dtype).replace("torch.", "")
        return out

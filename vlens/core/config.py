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
    act_fn: str = "silu"
    eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_kind: RopeKind = "mrope_chunked"
    mrope_section: list[int] = field(default_factory=list)  # per (t, h, w), sums to d_head // 2
    rope_attention_scaling: float = 1.0
    qk_norm: bool = False  # Qwen3: per-head RMSNorm on q and k before rotary
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
    n_deepstack_layers: int = 0
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

    @property
    def n_groups(self) -> int:
        """Query heads per key/value head (1 for plain multi-head attention)."""
        return self.n_heads // self.n_key_value_heads

    def to_dict(self) -> dict:
        out = asdict(self)
        out["dtype"] = str(self.dtype).replace("torch.", "")
        return out

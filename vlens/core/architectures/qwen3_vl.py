"""Qwen3-VL (dense): Qwen3 text decoder with per-head q/k RMSNorm, interleaved M-RoPE, DeepStack.

Differences from Qwen2.5-VL, and where each is handled:
- q/k norm: HF's `q_norm`/`k_norm` modules (RMSNorm over d_head) are passed to the core
  `Attention`, which applies them after `hook_q`/`hook_k` and before rotary, as HF does; so
  `hook_rot_q`/`hook_rot_k` are after norm + rotary and a `hook_attn_scores` edit acts after
  the norm (scaling the projection output before the norm would be undone by it).
- `head_dim` comes from the config (not d_model / n_heads); q/k/v/o biases follow `attention_bias`.
- interleaved M-RoPE: HF's rotary module is wrapped as is; positions from HF's `get_rope_index`.
- DeepStack: the vision tower's deepstack mergers produce one [n_image_tokens, d_model] tensor per
  early decoder layer; it is added at image positions after decoder layers 0..k-1 and exposed as
  `blocks.{l}.hook_deepstack`.
"""

from __future__ import annotations

from vlens.core.architectures.base import HFModule, ImageFeatures, token_id_list
from vlens.core.architectures.qwen2_vl import Qwen2VLAdapter
from vlens.core.architectures.registry import register_adapter
from vlens.core.components import HookedVisionTower
from vlens.core.components.vision import attach_vision_head_hooks
from vlens.core.config import VLMConfig


@register_adapter
class Qwen3VLAdapter(Qwen2VLAdapter):
    """Shares the Qwen2-VL bookkeeping (placeholder counts, `get_rope_index` positions, decoding
    deltas, chat format); overrides the config and the vision side."""

    hf_class_names = ("Qwen3VLForConditionalGeneration",)
    family = "qwen3_vl"

    def build_config(self, hf_model: HFModule) -> VLMConfig:
        cfg = super().build_config(hf_model)
        config = hf_model.config
        text = config.text_config
        cfg.d_head = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
        cfg.rope_kind = "mrope_interleaved"
        cfg.qk_norm = True
        bias = bool(getattr(text, "attention_bias", False))
        cfg.attn_qkv_bias = bias
        cfg.attn_out_bias = bias
        cfg.n_deepstack_layers = len(getattr(config.vision_config, "deepstack_visual_indexes", None) or [])
        if not cfg.eos_token_ids:
            cfg.eos_token_ids = token_id_list(getattr(text, "eos_token_id", None) or getattr(config, "eos_token_id", None))
        return cfg

    def build_vision(self, hf_model: HFModule) -> HookedVisionTower:
        visual = hf_model.model.visual
        vision = HookedVisionTower(visual, list(visual.blocks))
        # per-head outputs of every vision block's attention, [n_patches, n_heads, d_head]
        attach_vision_head_hooks(vision, [block.attn.proj for block in visual.blocks], visual.config.num_heads)
        return vision

    def encode_images(self, vision: HookedVisionTower, inputs) -> ImageFeatures:
        tower = vision.tower
        out = tower(inputs.pixel_values.type(tower.dtype), grid_thw=inputs.image_grid_thw)
        embeds = vision.hook_image_embeds(out.pooler_output)
        # [n_image_tokens, d_model] per early decoder layer; hooked at blocks.{l}.hook_deepstack
        return ImageFeatures(embeds=embeds, deepstack=list(getattr(out, "deepstack_features", None) or []))

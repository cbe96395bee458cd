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

from typing import Any

from vlens.core.architectures.base import HFModule, ImageFeatures, token_id_list
from vlens.core.architectures.qwen2_vl import Qwen2VLAdapter
from vlens.core.architectures.registry import register_adapter
from vlens.core.architectures.video import qwen3_timestamps
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
        out = self.run_tower(vision, inputs)
        embeds = vision.hook_image_embeds(self.placeholder_order(inputs, out.pooler_output))
        # [n_image_tokens, d_model] per early decoder layer; hooked at blocks.{l}.hook_deepstack
        deepstack = [self.placeholder_order(inputs, f) for f in getattr(out, "deepstack_features", None) or []]
        return ImageFeatures(embeds=embeds, deepstack=deepstack)

    def video_prompt(self, processor, video_inputs: dict[str, Any], index: int, fps: float, n_frames: int) -> str:
        """Each temporal patch in its own ``<|vision_start|>...<|vision_end|>``, after its time
        (``<1.2 seconds>``), as Qwen3-VL's processor writes it; the chat template's slot is replaced whole."""
        merge = int(getattr(processor.image_processor, "merge_size", 2))
        temporal = int(getattr(processor.image_processor, "temporal_patch_size", 2))
        grid_t, grid_h, grid_w = (int(v) for v in video_inputs["video_grid_thw"][index])
        per_frame = grid_h * grid_w // merge**2
        times = qwen3_timestamps(n_frames, fps, temporal)
        return "".join(f"<{times[k]:.1f} seconds><|vision_start|>" + "<|video_pad|>" * per_frame + "<|vision_end|>"
                       for k in range(grid_t))

"""Qwen2-VL and Qwen2.5-VL: Qwen2 text decoder with q/k/v bias, chunked M-RoPE.

The two families share the decoder and the bookkeeping; they differ in the vision tower
(Qwen2.5-VL: window attention, RMSNorm, SwiGLU), which stays HF's own module.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from vlens.core.architectures.base import (
    ArchitectureAdapter,
    HFModule,
    ImageFeatures,
    ImageTile,
    merge_visual_features,
    token_id_list,
)
from vlens.core.architectures.registry import register_adapter
from vlens.core.architectures.video import frame_records, qwen_video_patches
from vlens.core.components import HookedVisionTower
from vlens.core.config import VLMConfig
from vlens.utils.errors import UserInputError


@register_adapter
class Qwen2VLAdapter(ArchitectureAdapter):
    hf_class_names = ("Qwen2VLForConditionalGeneration",)
    family = "qwen2_vl"

    def build_config(self, hf_model: HFModule) -> VLMConfig:
        config = hf_model.config
        text = config.text_config
        d_head = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
        rope = text.rope_parameters or {}
        eos = getattr(hf_model.generation_config, "eos_token_id", None) if hasattr(hf_model, "generation_config") else None
        eos = eos if eos is not None else text.eos_token_id
        return VLMConfig(
            architecture=type(hf_model).__name__,
            n_layers=text.num_hidden_layers,
            d_model=text.hidden_size,
            n_heads=text.num_attention_heads,
            n_key_value_heads=text.num_key_value_heads,
            d_head=d_head,
            # MoE decoders without dense layers (Qwen3.5-MoE) have only the experts' size
            d_mlp=int(getattr(text, "intermediate_size", None) or getattr(text, "moe_intermediate_size", None) or 0),
            d_vocab=text.vocab_size,
            act_fn=text.hidden_act,
            eps=text.rms_norm_eps,
            rope_theta=float(rope.get("rope_theta", 10000.0)),
            rope_kind="mrope_chunked",
            mrope_section=list(rope.get("mrope_section") or []),
            qk_norm=False,
            attn_qkv_bias=True,
            attn_out_bias=False,
            tie_word_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
            image_token_id=config.image_token_id,
            video_token_id=config.video_token_id,
            vision_start_token_id=getattr(config, "vision_start_token_id", None),
            vision_end_token_id=getattr(config, "vision_end_token_id", None),
            pad_token_id=getattr(text, "pad_token_id", None),
            eos_token_ids=token_id_list(eos),
            spatial_merge_size=config.vision_config.spatial_merge_size,
            temporal_patch_size=int(getattr(config.vision_config, "temporal_patch_size", 2)),
            n_ctx=text.max_position_embeddings,
            model_name=getattr(config, "_name_or_path", "") or "",
            dtype=hf_model.lm_head.weight.dtype,
            device=str(hf_model.lm_head.weight.device),
        )

    def build_vision(self, hf_model: HFModule) -> HookedVisionTower:
        visual = hf_model.model.visual
        return HookedVisionTower(visual, list(visual.blocks))

    def check_inputs(self, cfg: VLMConfig, inputs) -> None:
        key_of = {"pixel_values": "image_grid_thw", "pixel_values_videos": "video_grid_thw"}
        for what, pixels, grid in (("pixel_values", inputs.pixel_values, inputs.image_grid_thw),
                                   ("pixel_values_videos", inputs.pixel_values_videos, inputs.video_grid_thw)):
            if pixels is not None and grid is None:
                key = key_of[what]
                raise UserInputError(
                    f"{what} were given without {key}. Qwen-VL models need the (t, h, w) patch grid of every "
                    f"image / video: pass {key} from the processor's output."
                )
            if pixels is not None:  # one row of flattened patches per (t, h, w) cell of every grid
                want = int(grid.prod(-1).sum())
                if pixels.ndim != 2 or pixels.shape[0] != want:
                    raise UserInputError(
                        f"{what} has shape {tuple(pixels.shape)} but {key_of[what]} {grid.tolist()} needs {want} rows "
                        "of patches: pass the pixels and their grids from the same processor output")

    def run_tower(self, vision: HookedVisionTower, inputs) -> Any:
        """The tower over the batch's images and videos at once (HF runs them one after the other; each grid
        attends only within itself, so one run gives the same features and fires each vision hook once):
        its output's features are [image tokens..., video tokens...]."""
        tower = vision.tower
        parts = [(p, g) for p, g in ((inputs.pixel_values, inputs.image_grid_thw),
                                     (inputs.pixel_values_videos, inputs.video_grid_thw)) if p is not None]
        pixels = torch.cat([p.type(tower.dtype) for p, _ in parts]) if len(parts) > 1 else parts[0][0].type(tower.dtype)
        grid = torch.cat([g for _, g in parts]) if len(parts) > 1 else parts[0][1]
        return tower(pixels, grid_thw=grid)

    def placeholder_order(self, inputs, features: Tensor) -> Tensor:
        """`features` ([image tokens..., video tokens...]) reordered to the placeholders' order in the batch."""
        if inputs.pixel_values_videos is None or inputs.pixel_values is None:
            return features
        types = inputs.mm_token_type_ids  # 1 image, 2 video (the adapter's `mm_token_type_ids`)
        is_video = types[types > 0] == 2
        n_image = int((~is_video).sum())
        return merge_visual_features(is_video, features[:n_image], features[n_image:])

    def encode_images(self, vision: HookedVisionTower, inputs) -> ImageFeatures:
        out = self.run_tower(vision, inputs)
        embeds = vision.hook_image_embeds(self.placeholder_order(inputs, out.pooler_output))
        return ImageFeatures(embeds=embeds, deepstack=[])

    def image_token_counts(self, cfg: VLMConfig, inputs) -> tuple[list[int], list[tuple[int, int]]]:
        return self._grid_counts(cfg, inputs.image_grid_thw)

    def _grid_counts(self, cfg: VLMConfig, grid_thw: Tensor | None) -> tuple[list[int], list[tuple[int, int]]]:
        if grid_thw is None:
            return [], []
        merge = cfg.spatial_merge_size
        counts, grids = [], []
        for t, h, w in grid_thw.tolist():
            counts.append(t * h * w // merge**2)
            grids.append((h // merge, w // merge))
        return counts, grids

    # ---- video (docs/video.md) ----
    def takes_video(self) -> bool:
        return True

    def process_videos(self, processor, videos: list[list[Any]], fps: float) -> dict[str, Any]:
        image_processor = getattr(processor, "image_processor", None)
        if image_processor is None:
            raise UserInputError("this processor has no image processor to prepare video frames with")
        temporal = int(getattr(image_processor, "temporal_patch_size", 2))
        made = [qwen_video_patches(image_processor, frames, temporal) for frames in videos]
        out: dict[str, Any] = {"pixel_values_videos": torch.cat([p for p, _ in made]),
                               "video_grid_thw": torch.tensor([g for _, g in made], dtype=torch.long)}
        if self.family == "qwen2_5_vl":  # its M-RoPE spaces temporal patches by their duration
            out["second_per_grid_ts"] = torch.tensor([temporal / fps] * len(videos))
        return out

    def video_placeholder(self) -> str:
        return "<|vision_start|><|video_pad|><|vision_end|>"

    def video_prompt(self, processor, video_inputs: dict[str, Any], index: int, fps: float, n_frames: int) -> str:
        merge = int(getattr(processor.image_processor, "merge_size", 2))
        count = int(video_inputs["video_grid_thw"][index].prod()) // merge**2
        return "<|vision_start|>" + "<|video_pad|>" * count + "<|vision_end|>"

    def video_token_counts(self, cfg: VLMConfig, inputs) -> tuple[list[int], list[tuple[int, int]]]:
        return self._grid_counts(cfg, inputs.video_grid_thw)

    def video_tiles(self, cfg: VLMConfig, inputs) -> list[list[ImageTile]]:
        if inputs.video_grid_thw is None:
            return []
        merge = cfg.spatial_merge_size
        return [frame_records(t, (h // merge, w // merge)) for t, h, w in inputs.video_grid_thw.tolist()]

    def frames_per_video_token(self, cfg: VLMConfig) -> int:
        return cfg.temporal_patch_size

    def position_ids(self, hf_model: HFModule, inputs) -> tuple[Tensor, Tensor]:
        # HF's own get_rope_index: batches, left padding, several images per row, text-only rows.
        extra = {"second_per_grid_ts": inputs.second_per_grid_ts} if inputs.second_per_grid_ts is not None else {}
        return hf_model.model.get_rope_index(
            inputs.input_ids,
            mm_token_type_ids=inputs.mm_token_type_ids,
            image_grid_thw=inputs.image_grid_thw,
            video_grid_thw=inputs.video_grid_thw,
            attention_mask=inputs.attention_mask,
            **extra,
        )

    def decode_position_ids(self, attention_mask: Tensor, n_new: int, deltas: Tensor | None) -> Tensor:
        if deltas is None:
            raise RuntimeError("Qwen2-VL decoding needs the rope deltas of the prompt run (get_rope_index)")
        text_pos = attention_mask.long().cumsum(-1) - 1
        text_pos = text_pos.masked_fill(attention_mask == 0, 0)[:, -n_new:]
        return (text_pos + deltas.to(text_pos.device)).unsqueeze(0).expand(3, -1, -1)

    def image_placeholder(self) -> str:
        return "<|vision_start|><|image_pad|><|vision_end|>"

    def fallback_chat_prompt(self, question: str, n_images: int) -> str:
        return (
            "<|im_start|>user\n" + self.image_placeholder() * n_images + question
            + "<|im_end|>\n<|im_start|>assistant\n"
        )


@register_adapter
class Qwen2_5_VLAdapter(Qwen2VLAdapter):
    hf_class_names = ("Qwen2_5_VLForConditionalGeneration",)
    family = "qwen2_5_vl"


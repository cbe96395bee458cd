"""Qwen2-VL and Qwen2.5-VL: Qwen2 text decoder with q/k/v bias, chunked M-RoPE.

The two families share the decoder and the bookkeeping; they differ in the vision tower
(Qwen2.5-VL: window attention, RMSNorm, SwiGLU), which stays HF's own module.
"""

from __future__ import annotations

from torch import Tensor

from vlens.core.architectures.base import ArchitectureAdapter, HFModule, ImageFeatures, token_id_list
from vlens.core.architectures.registry import register_adapter
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
            n_ctx=text.max_position_embeddings,
            model_name=getattr(config, "_name_or_path", "") or "",
            dtype=hf_model.lm_head.weight.dtype,
            device=str(hf_model.lm_head.weight.device),
        )

    def build_vision(self, hf_model: HFModule) -> HookedVisionTower:
        visual = hf_model.model.visual
        return HookedVisionTower(visual, list(visual.blocks))

    def check_inputs(self, cfg: VLMConfig, inputs) -> None:
        if inputs.pixel_values is not None and inputs.image_grid_thw is None:
            raise UserInputError(
                "pixel_values were given without image_grid_thw. Qwen-VL models need the (t, h, w) "
                "patch grid of every image: pass image_grid_thw from the processor's output."
            )
        if inputs.pixel_values is not None:  # one row of flattened patches per (t, h, w) cell of every grid
            want = int(inputs.image_grid_thw.prod(-1).sum())
            if inputs.pixel_values.ndim != 2 or inputs.pixel_values.shape[0] != want:
                raise UserInputError(
                    f"pixel_values has shape {tuple(inputs.pixel_values.shape)} but image_grid_thw "
                    f"{inputs.image_grid_thw.tolist()} needs {want} rows of patches: pass pixel_values and "
                    "image_grid_thw from the same processor output")

    def encode_images(self, vision: HookedVisionTower, inputs) -> ImageFeatures:
        tower = vision.tower
        pixel_values = inputs.pixel_values.type(tower.dtype)
        out = tower(pixel_values, grid_thw=inputs.image_grid_thw)
        embeds = vision.hook_image_embeds(out.pooler_output)
        return ImageFeatures(embeds=embeds, deepstack=[])

    def image_token_counts(self, cfg: VLMConfig, inputs) -> tuple[list[int], list[tuple[int, int]]]:
        if inputs.image_grid_thw is None:
            return [], []
        merge = cfg.spatial_merge_size
        counts, grids = [], []
        for t, h, w in inputs.image_grid_thw.tolist():
            counts.append(t * h * w // merge**2)
            grids.append((h // merge, w // merge))
        return counts, grids

    def position_ids(self, hf_model: HFModule, inputs) -> tuple[Tensor, Tensor]:
        # HF's own get_rope_index: batches, left padding, several images per row, text-only rows.
        return hf_model.model.get_rope_index(
            inputs.input_ids,
            mm_token_type_ids=inputs.mm_token_type_ids,
            image_grid_thw=inputs.image_grid_thw,
            attention_mask=inputs.attention_mask,
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


"""GLM-4.1V (`Glm4vForConditionalGeneration`): a GLM-4 text decoder with 3-D rotary, a Qwen2-VL-style tower.

- Decoder (`SandwichBlock`, plain RMSNorms): ``input_layernorm`` -> attention -> ``post_self_attn_layernorm``
  (+ residual) -> ``post_attention_layernorm`` -> MLP -> ``post_mlp_layernorm`` (+ residual), so `ln1`,
  `ln1_post`, `ln2`, `ln2_post` are those four; the MLP's gate and up projections are one fused
  ``gate_up_proj`` (`FusedGatedMLP`, gate rows first); q/k/v have biases, o none; d_head is d_model /
  n_heads (GLM's attention ignores a config `head_dim`).
- Positions: HF's own `get_rope_index` (3-D: t / h / w of each image's merged grid, text after an image
  continuing from max(h, w)), decoding deltas as Qwen2-VL's. The rotary module is HF's: M-RoPE sections
  (`mrope_section`) over the first `partial_rotary_factor` of each head's dimensions, each frequency
  repeated twice, rotating adjacent pairs (`VLMConfig.rope_adjacent_pairs`); the rest pass through.
- Vision: HF's `Glm4vVisionModel` as is (patch embed, post-conv RMSNorm, 2-D rotary, interpolated position
  embeddings, blocks, post-layernorm, a conv that merges merge x merge patches, the patch merger);
  hooks `vision.blocks.{i}.hook_resid_post` [n_patches, width], `vision.blocks.{i}.attn.hook_z`
  [n_patches, n_heads, d_head], `vision.hook_image_features` [n_image_tokens, d_model] (the merger's
  input, after the merging conv), `vision.hook_image_embeds` [n_image_tokens, d_model].
- Placeholders: ``<|begin_of_image|>`` + ``<|image|>`` * (t h w / merge^2) + ``<|end_of_image|>``; regions: one
  grid per image (h / merge, w / merge); markers "start" / "end" for the two tags.
- Videos (HF gives a video's frames the image token inside ``<|begin_of_video|>`` ... with timestamps) are
  refused: vlens runs GLM-4V on images.
- Prompt (fallback): `[gMASK]<sop><|user|>\\n<|begin_of_image|><|image|><|end_of_image|>{question}<|assistant|>\\n`.
"""

from __future__ import annotations

import torch

from vlens.core.architectures.base import HFModule, ImageFeatures, ImageTile, placeholder_runs, token_id_list
from vlens.core.architectures.qwen2_vl import Qwen2VLAdapter
from vlens.core.architectures.registry import register_adapter
from vlens.core.components import Attention, FusedGatedMLP, GatedMLP, HookedVisionTower, MoEMLP
from vlens.core.components.block import TransformerBlock
from vlens.core.components.sandwich_block import SandwichBlock
from vlens.core.components.vision import attach_vision_head_hooks
from vlens.core.config import VLMConfig
from vlens.core.hooks import HookPoint
from vlens.utils.errors import UserInputError


@register_adapter
class Glm4vAdapter(Qwen2VLAdapter):
    hf_class_names = ("Glm4vForConditionalGeneration",)
    family = "glm4v"
    simple_processor_image_token = "<|image|>"

    def build_config(self, hf_model: HFModule) -> VLMConfig:
        cfg = super().build_config(hf_model)
        config = hf_model.config
        text = config.text_config
        cfg.d_head = text.hidden_size // text.num_attention_heads
        cfg.rope_adjacent_pairs = True
        attn: HFModule = self.decoder_layers(hf_model)[0].self_attn
        cfg.attn_qkv_bias = attn.q_proj.bias is not None
        cfg.attn_out_bias = attn.o_proj.bias is not None
        cfg.video_token_id = None  # GLM's videos reuse the image token; vlens refuses videos
        cfg.vision_start_token_id = getattr(config, "image_start_token_id", None)
        cfg.vision_end_token_id = getattr(config, "image_end_token_id", None)
        if not cfg.eos_token_ids:
            cfg.eos_token_ids = token_id_list(getattr(text, "eos_token_id", None))
        return cfg

    def build_block(self, cfg: VLMConfig, layer: int, hf_layer: HFModule) -> TransformerBlock:
        return SandwichBlock(
            layer,
            ln1=self.build_norm(cfg, hf_layer.input_layernorm),
            attn=self.build_attention(cfg, layer, hf_layer),
            ln1_post=self.build_norm(cfg, hf_layer.post_self_attn_layernorm),
            ln2=self.build_norm(cfg, hf_layer.post_attention_layernorm),
            mlp=self.build_mlp(cfg, layer, hf_layer),
            ln2_post=self.build_norm(cfg, hf_layer.post_mlp_layernorm),
        )

    def build_attention(self, cfg: VLMConfig, layer: int, hf_layer: HFModule) -> Attention:
        sa = hf_layer.self_attn
        return Attention(cfg, layer, sa.q_proj, sa.k_proj, sa.v_proj, sa.o_proj)

    def build_mlp(self, cfg: VLMConfig, layer: int, hf_layer: HFModule) -> GatedMLP | MoEMLP:
        return FusedGatedMLP(hf_layer.mlp.gate_up_proj, hf_layer.mlp.down_proj, cfg.act_fn)

    # ---- vision ----
    def build_vision(self, hf_model: HFModule) -> HookedVisionTower:
        visual = hf_model.model.visual
        vision = HookedVisionTower(visual, list(visual.blocks))
        attach_vision_head_hooks(vision, [block.attn.proj for block in visual.blocks], visual.config.num_heads)
        vision.hook_image_features = HookPoint()  # [n_image_tokens, d_model]: the merger's input
        hook = vision.hook_image_features
        visual.merger.register_forward_pre_hook(lambda module, args: (hook(args[0]), *args[1:]))
        return vision

    def takes_video(self) -> bool:
        return False  # GLM's videos (image tokens between <|begin_of_video|> markers, timestamps) are not Qwen's

    def check_inputs(self, cfg: VLMConfig, inputs) -> None:
        if inputs.pixel_values_videos is not None or inputs.video_grid_thw is not None:
            raise UserInputError(f"vlens runs {self.family} on images only: pass a video's frames as images")
        super().check_inputs(cfg, inputs)

    def encode_images(self, vision: HookedVisionTower, inputs) -> ImageFeatures:
        tower = vision.tower
        out = tower(inputs.pixel_values.type(tower.dtype), grid_thw=inputs.image_grid_thw)
        return ImageFeatures(embeds=vision.hook_image_embeds(out.pooler_output), deepstack=[])

    def image_markers(self, cfg: VLMConfig, inputs) -> list[list[ImageTile]] | None:
        start, end = cfg.vision_start_token_id, cfg.vision_end_token_id
        if inputs.pixel_values is None or cfg.image_token_id is None or start is None or end is None:
            return None
        ids = inputs.input_ids.cpu()
        out = []
        for row, first, stop in placeholder_runs(ids, inputs.attention_mask.cpu(), cfg.image_token_id):
            marks = []
            if first > 0 and int(ids[row, first - 1]) == start:
                marks.append(ImageTile("start", torch.tensor([-1]), (1, 1), spatial=False))
            if stop < ids.shape[1] and int(ids[row, stop]) == end:
                marks.append(ImageTile("end", torch.tensor([stop - first]), (1, 1), spatial=False))
            out.append(marks)
        return out

    def image_placeholder(self) -> str:
        return "<|begin_of_image|><|image|><|end_of_image|>"

    def fallback_chat_prompt(self, question: str, n_images: int) -> str:
        return "[gMASK]<sop><|user|>\n" + self.image_placeholder() * n_images + question + "<|assistant|>\n"

"""Phi-4-multimodal (`Phi4MultimodalForCausalLM`), vision path: SigLIP (NaViT position buckets) over a global view
and HD crops, 2x2 average pooling, newline / separator feature tokens, a two-layer GELU projector, a Phi-3 decoder.

WORK IN PROGRESS (branch only): the decoder and the image features; no processor (HF's needs torchvision), no
regions beyond one non-spatial record per image, LoRA training refused (the fused qkv_proj has no q_proj of its own).

- Decoder (`model`, a `Phi4MultimodalModel`: `embed_tokens`, `layers`, `norm`, `rotary_emb`): fused `qkv_proj`
  (q, k, v rows in that order; exposed as row views), fused `gate_up_proj` (`FusedGatedMLP`), partial rotary.
- Audio inputs are refused: vlens runs the vision path only.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vlens.core.architectures.base import DecoderParts, HFModule, ImageFeatures, ImageTile, token_id_list
from vlens.core.architectures.llava import LlavaAdapter, sliding_layers
from vlens.core.architectures.registry import register_adapter
from vlens.core.components import Attention, FusedGatedMLP, GatedDeltaNet, HookedVisionTower, ShortConv
from vlens.core.components.vision import attach_vision_head_hooks
from vlens.core.config import VLMConfig
from vlens.core.hooks import HookPoint
from vlens.utils.errors import UserInputError


class RowSlice(nn.Module):
    """Rows [start, stop) of a fused projection, as a projection of its own (a view: HF's weight, not a copy)."""

    def __init__(self, fused: nn.Linear, start: int, stop: int):
        super().__init__()
        object.__setattr__(self, "_fused", fused)  # not a submodule: the fused layer belongs to the attention
        self.start, self.stop = start, stop
        self.out_features, self.in_features = stop - start, fused.in_features

    @property
    def weight(self) -> Tensor:
        return self._fused.weight[self.start:self.stop]

    @property
    def bias(self) -> Tensor | None:
        bias = self._fused.bias
        return None if bias is None else bias[self.start:self.stop]

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(x, self.weight, self.bias)


@register_adapter
class Phi4MultimodalAdapter(LlavaAdapter):
    hf_class_names = ("Phi4MultimodalForCausalLM",)
    family = "phi4_multimodal"

    def language_model(self, hf_model: HFModule) -> HFModule:
        return hf_model.model

    def build_config(self, hf_model: HFModule) -> VLMConfig:
        config = hf_model.config
        vision = config.vision_config
        self.feature_layer = int(vision.feature_layer)
        self.crop_size = int(vision.crop_size)
        self.patch_size = int(vision.patch_size)
        layer_types, window = sliding_layers(config)
        rope = getattr(config, "rope_parameters", None) or {}
        generation = getattr(hf_model, "generation_config", None)
        eos = getattr(generation, "eos_token_id", None) if generation is not None else None
        return VLMConfig(
            architecture=type(hf_model).__name__,
            n_layers=config.num_hidden_layers,
            d_model=config.hidden_size,
            n_heads=config.num_attention_heads,
            n_key_value_heads=config.num_key_value_heads or config.num_attention_heads,
            d_head=config.hidden_size // config.num_attention_heads,
            d_mlp=config.intermediate_size,
            d_vocab=config.vocab_size,
            act_fn=config.hidden_act,
            eps=config.rms_norm_eps,
            rope_theta=float(rope.get("rope_theta", 10000.0)),
            rope_kind="1d",
            layer_types=layer_types,
            sliding_window=window,
            attn_qkv_bias=False,
            attn_out_bias=False,
            tie_word_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
            image_token_id=int(vision.image_token_id),
            pad_token_id=getattr(config, "pad_token_id", None),
            eos_token_ids=token_id_list(eos if eos is not None else getattr(config, "eos_token_id", None)),
            spatial_merge_size=1,
            n_ctx=config.max_position_embeddings,
            model_name=getattr(config, "_name_or_path", "") or "",
            dtype=hf_model.lm_head.weight.dtype,
            device=str(hf_model.lm_head.weight.device),
        )

    def build_decoder(self, hf_model: HFModule, cfg: VLMConfig) -> DecoderParts:
        return super().build_decoder(hf_model, cfg)

    def query_projection(self, hf_layer: HFModule):
        return RowSlice(hf_layer.self_attn.qkv_proj, 0, hf_layer.self_attn.o_proj.in_features)

    def query_norm(self, hf_layer: HFModule):
        return None

    def build_attention(self, cfg: VLMConfig, layer: int, hf_layer: HFModule) -> Attention | GatedDeltaNet | ShortConv:
        sa = hf_layer.self_attn
        q, kv = cfg.n_heads * cfg.d_head, cfg.n_key_value_heads * cfg.d_head
        attention = Attention(cfg, layer, RowSlice(sa.qkv_proj, 0, q), RowSlice(sa.qkv_proj, q, q + kv),  # type: ignore[arg-type]
                              RowSlice(sa.qkv_proj, q + kv, q + 2 * kv), sa.o_proj)
        attention.qkv_proj = sa.qkv_proj  # registered here, so the model owns the fused weight once
        return attention

    def build_mlp(self, cfg: VLMConfig, layer: int, hf_layer: HFModule):
        return FusedGatedMLP(hf_layer.mlp.gate_up_proj, hf_layer.mlp.down_proj, cfg.act_fn)

    # ---- vision ----
    def build_vision(self, hf_model: HFModule) -> HookedVisionTower:
        embed = hf_model.model.embed_tokens_extend.image_embed
        tower = embed.img_processor
        layers = list(tower.encoder.layers)
        vision = HookedVisionTower(tower, layers, projector=embed)
        vision.hook_image_features = HookPoint()  # [n_crops, n_tokens, width]: pooled features of every crop
        attach_vision_head_hooks(vision, [layer.self_attn.out_proj for layer in layers],
                                 hf_model.config.vision_config.num_attention_heads)
        return vision

    def check_inputs(self, cfg: VLMConfig, inputs) -> None:
        if any(inputs.extra.get(k) is not None for k in ("audio_input_features", "audio_embed_sizes")):
            raise UserInputError("Phi-4-multimodal's audio inputs are not supported: vlens runs its vision path only "
                                 "(images and text). Drop the audio features.")
        pixel_values = inputs.pixel_values
        if pixel_values is None:
            return
        if pixel_values.ndim != 5 or inputs.extra.get("image_sizes") is None:
            raise UserInputError(f"Phi-4-multimodal expects image_pixel_values [n_images, n_crops, 3, crop, crop] with "
                                 f"image_sizes and image_attention_mask, got {tuple(pixel_values.shape)}")

    def encode_images(self, vision: HookedVisionTower, inputs) -> ImageFeatures:
        from transformers.masking_utils import create_bidirectional_mask

        embed: HFModule = vision.projector
        tower: HFModule = vision.tower
        pixel_values = inputs.pixel_values
        n_images, n_crops = pixel_values.shape[:2]
        flat = pixel_values.flatten(0, 1).to(tower.embeddings.patch_embedding.weight.dtype)
        mask = inputs.extra["image_attention_mask"].flatten(0, 1).to(dtype=torch.bool, device=flat.device)
        # HF's vision model block by block (its hidden_states: embeddings, then each layer's output)
        hidden = tower.embeddings(pixel_values=flat, patch_attention_mask=mask)
        attention = create_bidirectional_mask(config=tower.config, inputs_embeds=hidden,
                                              attention_mask=mask.view(mask.shape[0], -1))
        states = [hidden]
        for layer in tower.encoder.layers:
            hidden = layer(hidden, attention)
            states.append(hidden)
        feature = states[self.feature_layer]
        width = int(math.sqrt(feature.size(1)))
        grid = feature.view(-1, width, width, feature.size(-1)).permute(0, 3, 1, 2)
        if getattr(embed, "img_processor_padding", None) is not None:
            grid = embed.img_processor_padding(grid)
        pooled = embed.image_token_compression(grid).permute(0, 2, 3, 1)
        pooled = pooled.reshape(-1, pooled.size(1) * pooled.size(2), pooled.size(-1))
        pooled = vision.get_submodule("hook_image_features")(pooled)
        base = int(math.sqrt(pooled.shape[1]))
        features = pooled.view(n_images, -1, base * base, pooled.shape[-1])
        sizes = inputs.extra["image_sizes"].view(-1, 2)
        outputs = []
        for idx in range(n_images):  # HF's Phi4MultimodalImageEmbedding.forward, image by image
            height, width_px = (int(v) for v in sizes[idx])
            rows, cols = height // self.crop_size, width_px // self.crop_size
            global_img = features[idx, :1].reshape(1, base, base, -1)
            global_img = torch.cat([global_img, embed.sub_img_feature_extensor.repeat(1, base, 1, 1)], dim=2)
            global_img = global_img.reshape(1, -1, global_img.shape[-1])
            sub = features[idx, 1:1 + rows * cols].reshape(rows, cols, base, base, -1).transpose(1, 2)
            sub = sub.reshape(1, rows * base, cols * base, -1)
            crop_mask = inputs.extra["image_attention_mask"][idx, 1:rows * cols + 1, 0::2, 0::2]
            crop_mask = crop_mask.reshape(rows, cols, base, base).transpose(1, 2).reshape(1, rows * base, cols * base)
            useful_h, useful_w = int(crop_mask[0, :, 0].sum()), int(crop_mask[0, 0, :].sum())
            sub = sub[:, :useful_h, :useful_w]
            sub = torch.cat([sub, embed.sub_img_feature_extensor.repeat(1, useful_h, 1, 1)], dim=2)
            sub = sub.reshape(1, -1, sub.shape[-1])
            merged = torch.cat([sub, embed.global_img_feature_extensor, global_img], dim=1)
            merged = merged.to(embed.img_projection_up.bias.dtype)
            outputs.append(embed.img_projection_down(F.gelu(embed.img_projection_up(merged))))
        embeds = torch.cat(outputs, dim=1).squeeze(0)
        return ImageFeatures(embeds=vision.hook_image_embeds(embeds), deepstack=[])

    # ---- layout ----
    def _counts(self, inputs) -> list[int]:
        sizes = inputs.extra["image_sizes"].view(-1, 2).tolist()
        mask = inputs.extra["image_attention_mask"]
        base = mask.shape[-1] // 2 + mask.shape[-1] % 2
        counts = []
        for idx, (height, width) in enumerate(sizes):
            rows, cols = height // self.crop_size, width // self.crop_size
            crop_mask = mask[idx, 1:rows * cols + 1, 0::2, 0::2]
            crop_mask = crop_mask.reshape(rows, cols, base, base).transpose(1, 2).reshape(rows * base, cols * base)
            useful_h, useful_w = int(crop_mask[:, 0].sum()), int(crop_mask[0, :].sum())
            counts.append(useful_h * (useful_w + 1) + 1 + base * (base + 1))
        return counts

    def image_token_counts(self, cfg: VLMConfig, inputs) -> tuple[list[int], list[tuple[int, int]]]:
        if inputs.pixel_values is None:
            return [], []
        counts = self._counts(inputs)
        return counts, [(1, n) for n in counts]

    def image_tiles(self, cfg: VLMConfig, inputs) -> list[list[ImageTile]] | None:
        if inputs.pixel_values is None:
            return []
        return [[ImageTile("image", torch.arange(n), (1, n), spatial=False)] for n in self._counts(inputs)]

    def pixel_entries_per_image(self, cfg: VLMConfig, inputs) -> list[int] | None:
        return None

    def image_placeholder(self) -> str:
        return "<|image|>"

    def fallback_chat_prompt(self, question: str, n_images: int) -> str:
        return "<|user|>" + self.image_placeholder() * n_images + question + "<|end|><|assistant|>"

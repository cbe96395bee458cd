"""Phi-4-multimodal (`Phi4MultimodalForCausalLM`), vision path: SigLIP (NaViT position buckets) over a global view
and HD crops, 2x2 average pooling, newline / separator feature tokens, a two-layer GELU projector, a Phi-3 decoder.

- Decoder (`model`, a `Phi4MultimodalModel`: `embed_tokens`, `layers`, `norm`, `rotary_emb`): fused `qkv_proj`
  (q, k, v rows in that order; exposed as row views, so hooks and weights are per head while the weight stays
  HF's one tensor), fused `gate_up_proj` (`FusedGatedMLP`), partial rotary (HF's rotary module).
- Vision (`model.embed_tokens_extend.image_embed`): HF's SigLIP run block by block over every crop (the global
  view first, then the HD crops; `vision.blocks.{i}.hook_resid_post`, per-head `attn.hook_z`), the
  `feature_layer` state pooled 2 x 2 at `vision.hook_image_features` [n_images * n_crops, b * b, width], then
  HF's assembly (kept sub-image cells with a newline feature per row, the separator feature, the global view
  with a newline per row) and projector -> `vision.hook_image_embeds` [n_image_tokens, d_model].
- Inputs: HF names the pixels `image_pixel_values` [n_images, n_crops, 3, S, S] (with `image_sizes`, the HD
  canvas' height / width, and `image_attention_mask` [n_images, n_crops, S / p, S / p]); vlens holds them as
  `pixel_values` and hands them back to HF under HF's name (`hf_pixel_values_key`). HF's image processor needs
  torchvision: `Phi4MultimodalImageTextProcessor` (`phi4_multimodal_processor`) does its job without it.
- Regions: every image token is a `<|image|>` placeholder; its records (`image_tiles`) are one "tile" per crop
  (the crop's kept pooled cells, layout cell (r, c)), the sub-image "newline" features, the "separator"
  feature, the global view ("base", b x b: the image's grid) and its "newline" features. Pixels map through
  the HD canvas (`image_points_to_tile`), read from the model's image processor.
- Audio inputs are refused: vlens runs the vision path only. LoRA training / export is refused (the fused
  qkv_proj has no q_proj / v_proj of its own for vlens's LoRA to target).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vlens.core.architectures.base import (
    DecoderParts,
    HFModule,
    ImageFeatures,
    ImageTile,
    points_to_box_grid,
    token_id_list,
)
from vlens.core.architectures.llava import LlavaAdapter, sliding_layers
from vlens.core.architectures.phi4_multimodal_processor import Phi4MultimodalImageTextProcessor, crop_layout
from vlens.core.architectures.registry import register_adapter
from vlens.core.architectures.simple_processor import processor_from_folder
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
    def fused(self) -> nn.Linear:
        return self.__dict__["_fused"]

    @property
    def weight(self) -> Tensor:
        return self.fused.weight[self.start:self.stop]

    @property
    def bias(self) -> Tensor | None:
        bias = self.fused.bias
        return None if bias is None else bias[self.start:self.stop]

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(x, self.weight, self.bias)


@register_adapter
class Phi4MultimodalAdapter(LlavaAdapter):
    hf_class_names = ("Phi4MultimodalForCausalLM",)
    family = "phi4_multimodal"
    hf_pixel_values_key = "image_pixel_values"
    lora_refusal = ("its q / k / v projections are row views of one fused qkv_proj, so LoRA on them would not map "
                    "back to the checkpoint's qkv_proj (nor would a vlens-exported adapter load in HF / peft); "
                    "fine-tune it with peft on the HF model (target_modules=['qkv_proj', 'o_proj'])")

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
                              RowSlice(sa.qkv_proj, q + kv, q + 2 * kv), sa.o_proj)  # type: ignore[arg-type]
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
            # bidirectional, as HF's eager path and the checkpoint's SigLIP: HF's SigLIP attention says
            # is_causal=True, which its sdpa path obeys whenever no patch is masked (no mask tensor is built)
            hidden = layer(hidden, attention, is_causal=False)
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
    @property
    def base(self) -> int:
        """Side of a crop's pooled token grid (2 x 2 average pooling of crop / patch patches, the odd edge padded)."""
        mask_size = self.crop_size // self.patch_size
        return mask_size // 2 + mask_size % 2

    def _grids(self, inputs) -> list[tuple[int, int, int, int]]:
        """Per image: (crop rows, crop cols, kept pooled rows, kept pooled cols), as HF's image embedding reads
        them from image_sizes and each crop's image_attention_mask at [0::2, 0::2]."""
        sizes = inputs.extra["image_sizes"].view(-1, 2).tolist()
        mask = inputs.extra["image_attention_mask"]
        base, out = self.base, []
        for idx, (height, width) in enumerate(sizes):
            rows, cols = int(height) // self.crop_size, int(width) // self.crop_size
            crop_mask = mask[idx, 1:rows * cols + 1, 0::2, 0::2]
            crop_mask = crop_mask.reshape(rows, cols, base, base).transpose(1, 2).reshape(rows * base, cols * base)
            out.append((rows, cols, int(crop_mask[:, 0].sum()), int(crop_mask[0, :].sum())))
        return out

    def _records(self, rows: int, cols: int, kept_h: int, kept_w: int) -> list[ImageTile]:
        """One image's token records, positions from its first token: the kept sub-image cells row by row, each row
        closed by a newline feature; the separator feature; the global view, a newline per row. The sub-image
        cells split into one "tile" per crop (layout cell (r, c), index 1 + r * cols + c); every newline
        feature (both grids') is in one "newline" record, as LLaVA-NeXT's."""
        b, stride = self.base, kept_w + 1
        records = []
        for r in range(rows):
            for c in range(cols):
                r0, r1, c0, c1 = r * b, min((r + 1) * b, kept_h), c * b, min((c + 1) * b, kept_w)
                if r1 <= r0 or c1 <= c0:
                    continue  # a crop wholly in the padding keeps no cells
                positions = (torch.arange(r0, r1)[:, None] * stride + torch.arange(c0, c1)[None, :]).flatten()
                records.append(ImageTile("tile", positions, (r1 - r0, c1 - c0), index=1 + r * cols + c, layout=(r, c)))
        sub = kept_h * stride
        start = sub + 1  # the global view's first token
        newlines = torch.cat([torch.arange(kept_h) * stride + kept_w, start + torch.arange(b) * (b + 1) + b])
        records.append(ImageTile("newline", newlines, (kept_h + b, 1), spatial=False))  # both grids' row ends
        records.append(ImageTile("separator", torch.tensor([sub]), (1, 1), spatial=False))
        grid = torch.arange(b)[:, None] * (b + 1) + torch.arange(b)[None, :]
        records.append(ImageTile("base", start + grid.flatten(), (b, b), index=0))
        return records

    def image_layouts(self, inputs) -> list[list[ImageTile]]:
        return [self._records(*grid) for grid in self._grids(inputs)]

    def image_token_counts(self, cfg: VLMConfig, inputs) -> tuple[list[int], list[tuple[int, int]]]:
        """Per image: sub-image cells + newlines + separator + global view + newlines; grid: the global view's."""
        if inputs.pixel_values is None:
            return [], []
        counts = [h * (w + 1) + 1 + self.base * (self.base + 1) for _, _, h, w in self._grids(inputs)]
        return counts, [(self.base, self.base) for _ in counts]

    def image_tiles(self, cfg: VLMConfig, inputs) -> list[list[ImageTile]] | None:
        if inputs.pixel_values is None:
            return []
        return self.image_layouts(inputs)

    def image_points_to_tile(self, processor, points: Tensor, image_size: tuple[int, int],
                             tile: ImageTile) -> tuple[Tensor, Tensor]:
        """Through the HD canvas: the image resized (aspect kept) onto cols x rows crops of S px, white padding
        right / bottom; crop (r, c)'s cells are S / b px squares of it, the global view's cells cols * S / b by
        rows * S / b px (the whole canvas resized to S x S)."""
        if tile.kind not in ("tile", "base"):
            raise UserInputError(f"Phi-4-multimodal's {tile.kind} tokens are no places on the image")
        width, height = image_size
        size, dynamic_hd = _crop_settings(processor, self.crop_size)
        (cols, rows), (new_w, new_h), _ = crop_layout(height, width, size, dynamic_hd)
        sx, sy = width / new_w, height / new_h  # canvas px -> original px
        cell = size / self.base
        if tile.kind == "base":
            box = (0.0, 0.0, cols * size * sx, rows * size * sy)
            return points_to_box_grid(points, image_size, box, tile.grid)
        r, c = tile.layout or (0, 0)
        n_rows, n_cols = tile.grid
        box = (c * size * sx, r * size * sy, (c * size + n_cols * cell) * sx, (r * size + n_rows * cell) * sy)
        return points_to_box_grid(points, image_size, box, tile.grid)

    def pixel_entries_per_image(self, cfg: VLMConfig, inputs) -> list[int] | None:
        """One entry (all its crops) per image, so that selecting rows keeps each image's sizes and masks."""
        return None if inputs.pixel_values is None else [1] * int(inputs.pixel_values.shape[0])

    def load_processor(self, name_or_path: str, trust_remote_code: bool = False):
        return processor_from_folder(Phi4MultimodalImageTextProcessor, name_or_path, trust_remote_code)

    def image_placeholder(self) -> str:
        return "<|image|>"

    def fallback_chat_prompt(self, question: str, n_images: int) -> str:
        return "<|user|>" + self.image_placeholder() * n_images + question + "<|end|><|assistant|>"


def _crop_settings(processor, crop_size: int) -> tuple[int, int]:
    """(crop side, most crops per image) of the model's image processor (vlens's or HF's)."""
    image_processor = getattr(processor, "image_processor", processor)
    dynamic_hd = getattr(image_processor, "dynamic_hd", None)
    if dynamic_hd is None:
        raise UserInputError("Mapping pixels to Phi-4-multimodal's crops needs its image processor (dynamic_hd): "
                             "load the model with its processor")
    size = getattr(image_processor, "size", crop_size)
    size = size.get("height", crop_size) if isinstance(size, dict) else int(size)
    return int(size), int(dynamic_hd)

"""Molmo 2 (`Molmo2ForConditionalGeneration`): a ViT over overlapping crops, an attention-pooling adapter, a Qwen3
text decoder whose image tokens attend to each other.

- Decoder (`model.language_model`, a `Molmo2TextModel`): the Llama layout with per-head q / k RMSNorms
  (`qk_norm_type` "qwen3": Molmo2-4B / 8B), q/k/v biases from the config, 1-D RoPE (positions from the attention
  mask, LLaVA's rule). The embedding also holds `additional_vocab_size` rows past the LM head's vocabulary (the
  image tokens of the real checkpoints): `cfg.d_vocab_in`. Layers outside `rope_scaling_layers` read an unscaled
  rotary table (`LayerTypeRotary` over HF's two modules). Refused with the reason: `qk_norm_type` "olmo" (one
  RMSNorm over all heads' queries together, Molmo2-O) and `norm_after` (post-norm sublayers).
- Attention: every image token of a row (mm_token_type_ids 1: the patches and the structure tokens) is in one
  bidirectional block on top of the causal mask, as HF's `block_sequence_ids` (`attention_blocks`); generated
  tokens attend causally.
- Vision (`Molmo2VisionModel`, run block by block: patch embedding + positional embedding, encoder layers): each
  block's output at `vision.blocks.{i}.hook_resid_post` [n_crops, n_patches, width], per-head
  `vision.blocks.{i}.attn.hook_z`; the selected layers (`vision_feature_layer`) concatenated at
  `vision.hook_image_features` [n_crops, n_patches, width x n_layers]; HF's adapter (each token a query that is the
  mean of its pooled patches, cross-attending to them, then the SwiGLU projector) -> `vision.hook_image_embeds`
  [n_image_tokens, d_model]. HF ADDS these to the placeholders' embeddings (not replaces): the features that
  reach the residual are the hook's output plus the `<im_patch>` embedding.
- Tokens of an image (HF's `Molmo2Processor`): ``<low_res_im_start>`` + the low-resolution view's rows of
  ``<im_patch>`` each closed by ``<im_col>`` + ``<im_end>``, then ``<im_start>`` + the high-resolution rows (the
  crops' canvas, pooled) + ``<im_end>``. Regions: the high-res grid is the image ("image", the view that covers it),
  the low-res grid its "low_res" view; start / end / ``<im_col>`` ("newline") tokens are markers.
- Processor: HF's needs torchvision; `Molmo2ImageTextProcessor` does its image+text job in plain torch
  (`molmo2_processor`), and `load_processor` builds it from a folder.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from vlens.core.architectures.base import DecoderParts, HFModule, ImageFeatures, ImageTile, token_id_list
from vlens.core.architectures.llava import LlavaAdapter
from vlens.core.architectures.molmo2_processor import IMAGE_TOKENS, Molmo2ImageTextProcessor
from vlens.core.architectures.registry import register_adapter
from vlens.core.architectures.simple_processor import processor_from_folder
from vlens.core.components import HookedVisionTower, LayerTypeRotary
from vlens.core.components.vision import attach_vision_head_hooks
from vlens.core.config import VLMConfig
from vlens.core.hooks import HookPoint
from vlens.utils.errors import UserInputError


class _TwoTables(nn.Module):
    """HF's scaled and unscaled rotary modules behind one `forward(x, position_ids, layer_type)` (`LayerTypeRotary`)."""

    def __init__(self, scaled: nn.Module, unscaled: nn.Module):
        super().__init__()
        self.tables = {"full_attention": scaled, "unscaled_attention": unscaled}

    def forward(self, x: Tensor, position_ids: Tensor, layer_type: str) -> tuple[Tensor, Tensor]:
        return self.tables[layer_type](x, position_ids)


@register_adapter
class Molmo2Adapter(LlavaAdapter):
    """Molmo 2's crops, pooling adapter and bidirectional image block (module docstring)."""

    hf_class_names = ("Molmo2ForConditionalGeneration",)
    family = "molmo2"

    def build_config(self, hf_model: HFModule) -> VLMConfig:
        config = hf_model.config
        text = config.text_config
        if text.qk_norm_type != "qwen3" or text.norm_after:
            what = ("queries over all heads together (qk_norm_type 'olmo')" if text.qk_norm_type != "qwen3"
                    else "each sublayer's output (norm_after)")
            raise UserInputError(
                f"this Molmo 2 checkpoint's text model normalises {what}, as Molmo2-O's OLMo decoder does; vlens runs "
                "the Qwen3-based Molmo 2 (per-head q / k norms, pre-norm blocks) only: its heads and norms would not "
                "decompose as they do here.")
        self.image_ids = {int(i) for i in (config.image_start_token_id, config.low_res_image_start_token_id,
                                            config.image_end_token_id, config.image_patch_id,
                                            config.frame_start_token_id, config.frame_end_token_id)}
        self.image_ids |= getattr(self, "tokenizer_image_ids", set())
        self.feature_layers = list(config.adapter_config.vision_feature_layer)
        self.patch_token = int(config.image_token_id)
        self.view_tokens = {"low_res_start": int(config.low_res_image_start_token_id),
                            "start": int(config.image_start_token_id), "end": int(config.image_end_token_id)}
        rope = getattr(text, "rope_parameters", None) or {}
        scaled = set(text.rope_scaling_layers)
        two_tables = rope.get("rope_type", "default") != "default" and len(scaled) < text.num_hidden_layers
        generation = getattr(hf_model, "generation_config", None)
        eos = getattr(generation, "eos_token_id", None) if generation is not None else None
        attn: HFModule = self.decoder_layers(hf_model)[0].self_attn
        return VLMConfig(
            architecture=type(hf_model).__name__,
            n_layers=text.num_hidden_layers,
            d_model=text.hidden_size,
            n_heads=text.num_attention_heads,
            n_key_value_heads=text.num_key_value_heads or text.num_attention_heads,
            d_head=text.head_dim,
            d_mlp=text.intermediate_size,
            d_vocab=text.vocab_size,
            d_vocab_in=text.vocab_size + text.additional_vocab_size,
            act_fn=text.hidden_act,
            eps=text.rms_norm_eps,
            rope_theta=float(rope.get("rope_theta", 10000.0)),
            rope_kind="1d",
            layer_types=[("full_attention" if i in scaled else "unscaled_attention") for i in
                         range(text.num_hidden_layers)] if two_tables else [],
            rope_layer_types=["full_attention", "unscaled_attention"] if two_tables else [],
            qk_norm=True,
            attn_qkv_bias=attn.q_proj.bias is not None,
            attn_out_bias=attn.o_proj.bias is not None,
            tie_word_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
            image_token_id=config.image_token_id,
            pad_token_id=getattr(text, "pad_token_id", None),
            eos_token_ids=token_id_list(eos if eos is not None else getattr(text, "eos_token_id", None)),
            spatial_merge_size=1,
            n_ctx=text.max_position_embeddings,
            model_name=getattr(config, "_name_or_path", "") or "",
            dtype=hf_model.lm_head.weight.dtype,
            device=str(hf_model.lm_head.weight.device),
        )

    def build_decoder(self, hf_model: HFModule, cfg: VLMConfig) -> DecoderParts:
        parts = super().build_decoder(hf_model, cfg)
        lm = self.language_model(hf_model)
        self.patch_embedding = lm.embed_tokens  # HF adds the image features to the <im_patch> embedding
        if cfg.rope_layer_types:
            parts.rotary = LayerTypeRotary(_TwoTables(lm.rotary_emb, lm.rotary_emb_unscaled), cfg.rope_layer_types)
        return parts

    # ---- vision ----
    def build_vision(self, hf_model: HFModule) -> HookedVisionTower:
        tower = hf_model.model.vision_tower  # Molmo2VisionModel
        layers = list(tower.layers)
        vision = HookedVisionTower(tower, layers, projector=hf_model.model.multi_modal_projector)
        vision.hook_image_features = HookPoint()  # [n_crops, n_patches, width x n_layers]: the adapter's input
        attach_vision_head_hooks(vision, [layer.self_attn.o_proj for layer in layers],
                                 hf_model.config.vision_config.num_attention_heads)
        return vision

    def check_inputs(self, cfg: VLMConfig, inputs) -> None:
        pixel_values = inputs.pixel_values
        if pixel_values is None:
            return
        pooling, grids = inputs.extra.get("image_token_pooling"), inputs.extra.get("image_grids")
        if pixel_values.ndim != 3 or pooling is None or grids is None:
            raise UserInputError(f"Molmo 2 expects patchified crops: pixel_values [n_crops, n_patches, 3 * patch^2] "
                                 f"with image_token_pooling and image_grids, got pixel_values "
                                 f"{tuple(pixel_values.shape)}. Build inputs with model.prepare(...) or the processor.")
        crops = inputs.extra.get("image_num_crops")
        if crops is None and grids.shape[0] > 1:
            raise UserInputError("image_num_crops is needed for more than one image (each image's pooling indices "
                                 "count its own crops' patches): build inputs with the processor")
        if crops is not None and int(crops.sum()) != pixel_values.shape[0]:
            raise UserInputError(f"image_num_crops sums to {int(crops.sum())} but pixel_values holds "
                                 f"{pixel_values.shape[0]} crops")

    def encode_images(self, vision: HookedVisionTower, inputs) -> ImageFeatures:
        tower: HFModule = vision.tower
        pixel_values = inputs.pixel_values
        # HF's Molmo2VisionModel.forward, block by block (its hidden_states: the embeddings, then each layer's)
        hidden = tower.patch_embedding(pixel_values.to(tower.patch_embedding.weight.dtype))
        hidden = hidden + tower.positional_embedding[None, :, :].to(hidden)
        states = [hidden]
        for layer in tower.layers:
            hidden = layer(hidden, None)
            states.append(hidden)
        features = torch.cat([states[i + 1 if i >= 0 else i] for i in self.feature_layers], dim=-1)
        features = vision.get_submodule("hook_image_features")(features)
        grids = inputs.extra["image_grids"].to(features.device)
        pooling = inputs.extra["image_token_pooling"].to(features.device)
        sizes = grids[:, 0] * grids[:, 1] + grids[:, 2] * grids[:, 3]
        if grids.shape[0] > 1:  # each image's indices count its own crops' patches (HF's offsets)
            per_image = inputs.extra["image_num_crops"].to(features.device) * pixel_values.shape[-2]
            offsets = (per_image.cumsum(0) - per_image).repeat_interleave(sizes, output_size=pooling.shape[0])
            pooling = torch.where(pooling >= 0, pooling + offsets[:, None], pooling)
        if vision.projector is None:
            raise RuntimeError("a Molmo 2 vision tower needs its adapter")
        pooled = vision.hook_image_embeds(vision.projector(features, pooling).last_hidden_state)
        patch = self.patch_embedding(torch.tensor(self.patch_token, device=pooled.device))
        return ImageFeatures(embeds=pooled + patch.to(pooled.dtype), deepstack=[])

    # ---- tokens, blocks and regions ----
    def bind_processor(self, processor) -> None:
        tokenizer = getattr(processor, "tokenizer", processor)
        if tokenizer is None or not hasattr(tokenizer, "convert_tokens_to_ids"):
            return
        unknown = getattr(tokenizer, "unk_token_id", None)
        ids = [tokenizer.convert_tokens_to_ids(t) for t in IMAGE_TOKENS]
        self.tokenizer_image_ids = {int(i) for i in ids if i is not None and i != unknown}
        if hasattr(self, "image_ids"):
            self.image_ids |= self.tokenizer_image_ids

    def mm_token_type_ids(self, cfg: VLMConfig, input_ids: Tensor) -> Tensor | None:
        """1 on every image token (patches and structure tokens, HF's processor's `image_token_ids`), else 0."""
        return torch.isin(input_ids, torch.tensor(sorted(self.image_ids), device=input_ids.device)).long()

    def attention_blocks(self, cfg: VLMConfig, inputs) -> Tensor | None:
        """HF's `block_sequence_ids`: every image token of a row in block 0, every other token -1."""
        types = inputs.mm_token_type_ids
        if types is None:
            types = self.mm_token_type_ids(cfg, inputs.input_ids)
        image = (types.to(inputs.input_ids.device) == 1) & inputs.attention_mask.bool()
        if not bool(image.any()):
            return None
        return torch.where(image, 0, -1)

    def _grids(self, inputs) -> list[tuple[int, int, int, int]]:
        if inputs.pixel_values is None:
            return []
        return [(int(a), int(b), int(c), int(d)) for a, b, c, d in inputs.extra["image_grids"].tolist()]

    def image_token_counts(self, cfg: VLMConfig, inputs) -> tuple[list[int], list[tuple[int, int]]]:
        """Per image: its low-res and high-res tokens; grid: the high-res view's (the crops' canvas, pooled)."""
        grids = self._grids(inputs)
        return [lh * lw + hh * hw for lh, lw, hh, hw in grids], [(hh, hw) for _, _, hh, hw in grids]

    def image_tiles(self, cfg: VLMConfig, inputs) -> list[list[ImageTile]] | None:
        return [[ImageTile("low_res", torch.arange(lh * lw), (lh, lw)),
                 ImageTile("image", torch.arange(lh * lw, lh * lw + hh * hw), (hh, hw))]
                for lh, lw, hh, hw in self._grids(inputs)]

    def pixel_entries_per_image(self, cfg: VLMConfig, inputs) -> list[int] | None:
        crops = inputs.extra.get("image_num_crops")
        return None if crops is None else [int(c) for c in crops.tolist()]

    def image_markers(self, cfg: VLMConfig, inputs) -> list[list[ImageTile]] | None:
        """Each view's start token (``<low_res_im_start>`` / ``<im_start>``), its rows' ``<im_col>`` ("newline")
        and its ``<im_end>``: the image tokens around the image's placeholders that are not placeholders."""
        grids = self._grids(inputs)
        if not grids or cfg.image_token_id is None:
            return None
        ids, mask = inputs.input_ids.cpu(), inputs.attention_mask.cpu().bool()
        starts = {self.view_tokens["low_res_start"], self.view_tokens["start"]}
        end = self.view_tokens["end"]
        out, image = [], 0
        for row in range(ids.shape[0]):
            placeholders = ((ids[row] == cfg.image_token_id) & mask[row]).nonzero().flatten().tolist()
            k = 0
            while k < len(placeholders) and image < len(grids):
                lh, lw, hh, hw = grids[image]
                mine = placeholders[k:k + lh * lw + hh * hw]
                first, last = mine[0], mine[-1]
                marks = []
                position = first - 1
                while position <= last + 2 and position < ids.shape[1]:
                    token = int(ids[row, position])
                    if token in starts:
                        kind = "start"
                    elif token == end:
                        kind = "end"
                    elif token in self.image_ids and token != cfg.image_token_id and position > first:
                        kind = "newline"
                    else:
                        kind = ""
                    if kind:
                        marks.append(ImageTile(kind, torch.tensor([position - first]), (1, 1), spatial=False))
                    if kind == "end" and position > last:
                        break
                    position += 1
                out.append(marks)
                k += len(mine)
                image += 1
        return out

    def image_points_to_grid(self, processor, points: Tensor, image_size: tuple[int, int],
                             grid: tuple[int, int]) -> tuple[Tensor, Tensor]:
        """The high-res grid (the image's view) covers the crops' canvas: the whole image resized."""
        return self._view_points(processor, points, image_size, grid, low_res=False)

    def image_points_to_tile(self, processor, points: Tensor, image_size: tuple[int, int],
                             tile: ImageTile) -> tuple[Tensor, Tensor]:
        return self._view_points(processor, points, image_size, tile.grid, low_res=tile.kind == "low_res")

    def _view_points(self, processor, points: Tensor, image_size: tuple[int, int], grid: tuple[int, int],
                     low_res: bool) -> tuple[Tensor, Tensor]:
        """Points -> a view's token grid: the low-res view squashes the whole image to one crop, the high-res view
        to the canvas; each pools windows of patches, padded evenly with empty slots where they do not divide."""
        image_processor = getattr(processor, "image_processor", processor)
        if not hasattr(image_processor, "crop_geometry"):
            return super().image_points_to_grid(processor, points, image_size, grid)
        width, height = image_size
        p, (pool_h, pool_w) = image_processor.patch_size, image_processor.pooling_size
        _, _, canvas_h, canvas_w = image_processor.crop_geometry(int(height), int(width))
        side = image_processor.size // p
        patches = (side, side) if low_res else (canvas_h // p, canvas_w // p)
        x, y = points[:, 0], points[:, 1]
        visible = (x >= 0) & (x <= width) & (y >= 0) & (y <= height)
        pad_top = (grid[0] * pool_h - patches[0]) // 2
        pad_left = (grid[1] * pool_w - patches[1]) // 2
        rows = (y * patches[0] / height + pad_top) / pool_h - 0.5
        cols = (x * patches[1] / width + pad_left) / pool_w - 0.5
        return torch.stack([rows, cols], dim=-1), visible

    # ---- prompts ----
    def load_processor(self, name_or_path: str, trust_remote_code: bool = False):
        return processor_from_folder(Molmo2ImageTextProcessor, name_or_path, trust_remote_code)

    def image_placeholder(self) -> str:
        return "<|image|>"

    def fallback_chat_prompt(self, question: str, n_images: int) -> str:
        return "<|im_start|>user\n" + self.image_placeholder() * n_images + question + "<|im_end|>\n<|im_start|>assistant\n"

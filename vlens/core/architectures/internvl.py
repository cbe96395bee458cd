"""InternVL 2.5 / 3 (`InternVLForConditionalGeneration`): InternViT, pixel shuffle, MLP projector,
dynamic tiles with a thumbnail; a Qwen2 or Llama text decoder.

- Decoder and positions: LLaVA's (`LlavaAdapter.decoder_config`: Qwen2 / Llama / Mistral layout,
  1-D RoPE, `cumsum(mask) - 1` positions as HF `generate` uses).
- Tiles (HF's `GotOcr2ImageProcessor` with `crop_to_patches`): each image is resized, aspect NOT
  kept, to the (rows x cols) tile layout whose aspect ratio is closest to the image's (at most
  `max_patches` tiles), cut into rows * cols square tiles of the tower's side, and followed by a
  thumbnail (the whole image squashed to one tile) when it has more than one tile. pixel_values
  [n_tiles, C, T, T] holds every image's tiles, in order; the model itself knows nothing of images.
- Vision (computed block by block, so edits on block hooks reach the features): InternViT embeds
  each tile (CLS + patches), runs its layers, takes `vision_feature_layer` (-1: the last hidden
  state after the tower's final norm, else HF's `hidden_states[i]`), drops CLS ("default"), pixel-
  shuffles the (T/p) x (T/p) patch grid by `downsample_ratio` (HF's own `pixel_shuffle`: 2x2 patches
  -> one token of 4x the width) and projects (LayerNorm -> Linear -> GELU -> Linear).
- Placeholders: each image is ``<img>`` + ``<IMG_CONTEXT>`` * (tiles * tokens per tile) + ``</img>``;
  an image's tiles are found from its run of placeholder tokens.
- Regions: one "image" record for a one-tile image; otherwise a "tile" per tile (its g x g token grid,
  index = its place among the image's tiles) and the "base" view (the thumbnail, last). The tile
  layout needs each image's original size: `InternVLImageTextProcessor` (what `model.prepare` uses)
  returns `image_sizes`, which InternVL's HF forward accepts and ignores; with it every tile gets its
  `layout` cell, `layout_grid` and pixel `box` (the layout is HF's `get_optimal_tiled_canvas` among the
  layouts of that many tiles). Without it (HF's own processor output) the tiles are marked
  non-spatial (where they lie is unknown). `markers`: "start" / "end" (``<img>`` / ``</img>``) when the
  model knows its processor.
- Hooks: `vision.blocks.{i}.hook_resid_post` [n_tiles, 1 + (T/p)^2, width], `vision.blocks.{i}.attn.hook_z`
  [n_tiles, 1 + (T/p)^2, heads, d_head], `vision.hook_image_features` [n_tiles, g^2, width / ratio^2]
  (projector input, after pixel shuffle), `vision.hook_tile_embeds` [n_tiles, g^2, d_model] (projector
  output), `vision.hook_image_embeds` [n_image_tokens, d_model].
- HF's `InternVLProcessor` needs a video processor, which needs torchvision: `InternVLImageTextProcessor`
  is HF's class without it (the same expansion), which `load_processor` builds from a folder.
- Prompt (InternVL3-hf chat template): `<|im_start|>user\\n<IMG_CONTEXT>\\n{question}<|im_end|>\\n<|im_start|>assistant\\n`.
"""

from __future__ import annotations

import logging

import torch
from PIL import Image
from torch import Tensor
from transformers import InternVLProcessor
from transformers.models.got_ocr2.image_processing_pil_got_ocr2 import get_optimal_tiled_canvas

from vlens.core.architectures.base import (
    ArchitectureAdapter,
    HFModule,
    ImageFeatures,
    ImageTile,
    layout_box,
    placeholder_runs,
)
from vlens.core.architectures.llava import LlavaAdapter
from vlens.core.architectures.registry import register_adapter
from vlens.core.components import HookedVisionTower
from vlens.core.components.vision import attach_vision_head_hooks
from vlens.core.config import VLMConfig
from vlens.core.hooks import HookPoint
from vlens.utils.errors import UserInputError

logger = logging.getLogger(__name__)


class InternVLImageTextProcessor(InternVLProcessor):
    """HF's `InternVLProcessor` for images and text only (no video processor, so no torchvision), that
    also returns each image's original ``image_sizes`` [n_images, 2] (height, width), which the tile
    regions need (InternVL's HF forward takes and ignores it).

    Built like HF's: ``InternVLImageTextProcessor(image_processor, tokenizer, image_seq_length=...,
    chat_template=...)``, with a tokenizer that names ``start_image_token`` / ``end_image_token`` /
    ``context_image_token`` / ``video_token`` (HF's InternVL tokenizers do).
    """

    @classmethod
    def get_attributes(cls) -> list[str]:
        return ["image_processor", "tokenizer"]

    def __init__(self, image_processor=None, tokenizer=None, image_seq_length: int = 256, chat_template=None,
                 **kwargs):
        kwargs.pop("video_processor", None)
        super().__init__(image_processor, tokenizer, None, image_seq_length=image_seq_length,
                         chat_template=chat_template, **kwargs)

    def __call__(self, images=None, text=None, videos=None, **kwargs):
        if videos is not None:
            raise UserInputError("vlens runs InternVL on images only: pass video frames as images")
        out = super().__call__(images=images, text=text, **kwargs)
        if images is not None:
            sizes = [list(image_hw(image)) for image in flat_images(images)]
            out["image_sizes"] = torch.tensor(sizes, dtype=torch.long) if kwargs.get("return_tensors") == "pt" else sizes
        return out


def flat_images(images) -> list:
    if isinstance(images, (list, tuple)):
        return [leaf for item in images for leaf in flat_images(item)]
    return [images]


def image_hw(image) -> tuple[int, int]:
    """(height, width) of a PIL image, an array [H, W, C] / [C, H, W] or a tensor [C, H, W]."""
    if isinstance(image, Image.Image):
        return int(image.height), int(image.width)
    shape = tuple(image.shape)
    if len(shape) == 3 and shape[0] in (1, 3, 4) and shape[-1] not in (1, 3, 4):
        return int(shape[1]), int(shape[2])
    return int(shape[0]), int(shape[1])


@register_adapter
class InternVLAdapter(LlavaAdapter):
    hf_class_names = ("InternVLForConditionalGeneration",)
    family = "internvl"

    def build_config(self, hf_model: HFModule) -> VLMConfig:
        config = hf_model.config
        self.feature_layer = config.vision_feature_layer
        self.select_strategy = config.vision_feature_select_strategy
        patch = config.vision_config.patch_size
        self.patch_size = int(patch[0] if isinstance(patch, (list, tuple)) else patch)
        self.downsample_ratio = float(config.downsample_ratio)
        self.hf_pixel_shuffle = hf_model.model.pixel_shuffle  # HF's own (read in `encode_images`)
        self.start_id: int | None = None
        self.end_id: int | None = None
        return self.decoder_config(hf_model)

    def bind_processor(self, processor) -> None:
        tokenizer = getattr(processor, "tokenizer", processor)
        self.start_id = getattr(processor, "start_image_token_id", None) or getattr(tokenizer, "start_image_token_id",
                                                                                  None)
        self.end_id = getattr(processor, "end_image_token_id", None) or getattr(tokenizer, "end_image_token_id", None)

    # ---- vision ----
    def build_vision(self, hf_model: HFModule) -> HookedVisionTower:
        tower = hf_model.model.vision_tower
        layers = list(tower.encoder.layer)
        vision = HookedVisionTower(tower, layers, projector=hf_model.model.multi_modal_projector)
        vision.hook_image_features = HookPoint()  # [n_tiles, g * g, width / ratio^2]: projector input
        vision.hook_tile_embeds = HookPoint()  # [n_tiles, g * g, d_model]: projector output
        heads = hf_model.config.vision_config.num_attention_heads
        attach_vision_head_hooks(vision, [layer.attention.projection_layer for layer in layers], heads)
        return vision

    def check_inputs(self, cfg: VLMConfig, inputs) -> None:
        strategy = inputs.extra.get("vision_feature_select_strategy") or self.select_strategy
        if strategy != "default":
            raise UserInputError(f"InternVL drops the CLS token before the pixel shuffle (vision_feature_select_strategy "
                                 f"'default'); {strategy!r} would leave a patch grid HF cannot shuffle")
        layer = inputs.extra.get("vision_feature_layer", self.feature_layer)
        if not isinstance(layer, int):
            raise UserInputError(f"InternVL reads one vision layer (an int vision_feature_layer), got {layer!r}")
        pixel_values = inputs.pixel_values
        if pixel_values is None:
            return
        if pixel_values.ndim != 4:
            raise UserInputError(f"InternVL expects pixel_values [n_tiles, channels, height, width] (every image's "
                                 f"tiles concatenated), got {tuple(pixel_values.shape)}. Build inputs with "
                                 "model.prepare(...) or the InternVL processor.")
        height, width = pixel_values.shape[-2:]
        side = height // self.patch_size
        if height != width or height % self.patch_size:
            raise UserInputError(f"InternVL tiles must be square and a multiple of the patch size {self.patch_size} "
                                 f"px, got {height}x{width}: the processor's size sets them")
        if side * self.downsample_ratio != int(side * self.downsample_ratio) or int(side * self.downsample_ratio) < 1:
            raise UserInputError(f"a tile of {side}x{side} patches cannot be pixel-shuffled by downsample_ratio "
                                 f"{self.downsample_ratio}; use a tile side whose patch count it divides")

    def tile_side(self, inputs) -> int:
        """Tokens per tile side after the pixel shuffle (g)."""
        return int(inputs.pixel_values.shape[-1] // self.patch_size * self.downsample_ratio)

    def encode_images(self, vision: HookedVisionTower, inputs) -> ImageFeatures:
        tower: HFModule = vision.tower
        layer = inputs.extra.get("vision_feature_layer", self.feature_layer)
        dtype = tower.embeddings.patch_embeddings.projection.weight.dtype
        hidden = tower.embeddings(inputs.pixel_values.to(dtype))  # [n_tiles, 1 + patches, width]
        states = [hidden]
        for block in tower.encoder.layer:
            hidden = block(hidden)
            states.append(hidden)
        features = tower.layernorm(states[-1]) if layer == -1 else states[layer]
        features = features[:, 1:]  # "default": drop CLS
        n_tiles, n_patches, width = features.shape
        side = int(n_patches**0.5)
        shuffled = self.hf_pixel_shuffle(features.reshape(n_tiles, side, side, width),
                                         scale_factor=self.downsample_ratio)
        shuffled = vision.get_submodule("hook_image_features")(shuffled.reshape(n_tiles, -1, shuffled.shape[-1]))
        if vision.projector is None:
            raise RuntimeError("an InternVL vision tower needs its multi-modal projector")
        per_tile = vision.get_submodule("hook_tile_embeds")(vision.projector(shuffled))
        embeds = vision.hook_image_embeds(per_tile.reshape(-1, per_tile.shape[-1]))
        return ImageFeatures(embeds=embeds, deepstack=[])

    # ---- tiles and regions ----
    def _runs(self, cfg: VLMConfig, inputs) -> list[tuple[int, int, int]]:
        if cfg.image_token_id is None:
            return []
        return placeholder_runs(inputs.input_ids.cpu(), inputs.attention_mask.cpu(), cfg.image_token_id)

    def tiles_per_image(self, cfg: VLMConfig, inputs) -> list[int]:
        """Per image (one run of placeholder tokens each): its tiles in pixel_values (thumbnail included)."""
        if inputs.pixel_values is None:
            return []
        per_tile = self.tile_side(inputs) ** 2
        counts = []
        for _, start, end in self._runs(cfg, inputs):
            if (end - start) % per_tile:
                raise UserInputError(f"an image's {end - start} placeholder tokens are not a whole number of tiles of "
                                     f"{per_tile} tokens: the processor's image_seq_length does not fit this model "
                                     "(it must be (tile side / patch * downsample_ratio) ** 2)")
            counts.append((end - start) // per_tile)
        if sum(counts) != inputs.pixel_values.shape[0]:
            raise UserInputError(f"the prompts' placeholders make {sum(counts)} tiles but pixel_values holds "
                                 f"{inputs.pixel_values.shape[0]}: build inputs with model.prepare(...) or the processor")
        return counts

    def pixel_entries_per_image(self, cfg: VLMConfig, inputs) -> list[int] | None:
        return self.tiles_per_image(cfg, inputs)

    def image_sizes(self, inputs) -> list[tuple[int, int]] | None:
        """Each image's original (height, width) (`image_sizes` from `InternVLImageTextProcessor`), or None."""
        sizes = inputs.extra.get("image_sizes")
        if sizes is None:
            return None
        values = sizes.tolist() if isinstance(sizes, Tensor) else [list(s) for s in sizes]
        return [(int(h), int(w)) for h, w in values]

    def original_image_sizes(self, inputs) -> list[tuple[int, int]] | None:
        sizes = self.image_sizes(inputs)
        return [(w, h) for h, w in sizes] if sizes else None

    def image_layouts(self, cfg: VLMConfig, inputs) -> list[list[ImageTile]]:
        """Per image, its token records (positions from its first token), in HF's order."""
        counts = self.tiles_per_image(cfg, inputs)
        sizes = self.image_sizes(inputs)
        if sizes is not None and len(sizes) != len(counts):
            raise UserInputError(f"image_sizes holds {len(sizes)} images but the prompts {len(counts)}")
        g = self.tile_side(inputs) if counts else 0
        tile_px = int(inputs.pixel_values.shape[-1]) if counts else 0
        return [internvl_tiles(n, g, tile_px, None if sizes is None else sizes[k]) for k, n in enumerate(counts)]

    def image_token_counts(self, cfg: VLMConfig, inputs) -> tuple[list[int], list[tuple[int, int]]]:
        """Per image: tiles x g^2 tokens; grid: the (g, g) grid of the view that covers the whole image."""
        layouts = self.image_layouts(cfg, inputs)
        return [sum(len(t.positions) for t in records) for records in layouts], [records[-1].grid for records in layouts]

    def image_tiles(self, cfg: VLMConfig, inputs) -> list[list[ImageTile]] | None:
        return self.image_layouts(cfg, inputs)

    def image_markers(self, cfg: VLMConfig, inputs) -> list[list[ImageTile]] | None:
        if inputs.pixel_values is None or self.start_id is None or self.end_id is None:
            return None
        ids = inputs.input_ids.cpu()
        out = []
        for row, start, end in self._runs(cfg, inputs):
            marks = []
            if start > 0 and int(ids[row, start - 1]) == self.start_id:
                marks.append(ImageTile("start", torch.tensor([-1]), (1, 1), spatial=False))
            if end < ids.shape[1] and int(ids[row, end]) == self.end_id:
                marks.append(ImageTile("end", torch.tensor([end - start]), (1, 1), spatial=False))
            out.append(marks)
        return out

    image_points_to_grid = ArchitectureAdapter.image_points_to_grid  # the processor squashes the whole image

    # ---- processor and prompts ----
    def load_processor(self, name_or_path: str, trust_remote_code: bool = False):
        try:
            return InternVLImageTextProcessor.from_pretrained(name_or_path, trust_remote_code=trust_remote_code)
        except (OSError, ValueError, TypeError, AttributeError) as error:
            logger.info("InternVLImageTextProcessor unavailable for %s: %s", name_or_path, error)
            return None

    def image_placeholder(self) -> str:
        return "<IMG_CONTEXT>"

    def fallback_chat_prompt(self, question: str, n_images: int) -> str:
        return ("<|im_start|>user\n" + (self.image_placeholder() + "\n") * n_images + question +
                "<|im_end|>\n<|im_start|>assistant\n")


def internvl_tiles(n_tiles: int, g: int, tile_px: int, image_size: tuple[int, int] | None) -> list[ImageTile]:
    """The token records of one InternVL image of `n_tiles` tiles of g x g tokens (positions from its
    first token): one "image" record for a single tile; else a "tile" per tile, row-major over the
    layout, then the "base" thumbnail. image_size: the original (height, width), which fixes the layout
    (HF's `get_optimal_tiled_canvas` among the layouts of n_tiles - 1 tiles), or None (layout unknown:
    the tiles are marked non-spatial)."""
    per_tile = g * g
    if n_tiles == 1:
        return [ImageTile("image", torch.arange(per_tile), (g, g))]
    k = n_tiles - 1
    layout_grid = None
    if image_size is not None:
        cols, rows = get_optimal_tiled_canvas((int(image_size[0]), int(image_size[1])), (tile_px, tile_px), k, k)
        layout_grid = (int(rows), int(cols))
    records = []
    for i in range(k):
        positions = torch.arange(i * per_tile, (i + 1) * per_tile)
        if layout_grid is None or image_size is None:
            records.append(ImageTile("tile", positions, (g, g), index=i, spatial=False))
            continue
        cell = divmod(i, layout_grid[1])
        records.append(ImageTile("tile", positions, (g, g), index=i, layout=cell, layout_grid=layout_grid,
                                 box=layout_box((image_size[1], image_size[0]), cell, layout_grid)))
    box = None if image_size is None else (0.0, 0.0, float(image_size[1]), float(image_size[0]))
    records.append(ImageTile("base", torch.arange(k * per_tile, n_tiles * per_tile), (g, g), index=k, box=box))
    return records

"""LLaVA-NeXT (`LlavaNextForConditionalGeneration`): LLaVA-1.5's decoder and tower, anyres tiles.

- Decoder, vision tower, positions and feature selection: LLaVA-1.5's (`LlavaAdapter`: Llama /
  Mistral / Qwen2 text model, CLIP or SigLIP tower run block by block, 1-D RoPE).
- Anyres (HF's processor and `pack_image_features`): each image is resized to the best of
  `image_grid_pinpoints` (aspect kept, padded), cut into tiles of the tower's input side, and
  preceded by a base view (the whole image squashed to one tile). Every tile goes through the
  tower and projector; HF then lays the tiles' tokens out as one high-resolution grid, removes
  the rows (or columns) that fall on the padding ("unpad"), appends the learned
  `image_newline` vector after each grid row and puts the base view's tokens first. vlens
  runs HF's own packing on the hooked projector output, so the order is HF's.
- Regions: `inputs.regions.tiles[row][image]` holds the base view ("base", its g x g grid), each
  high-resolution tile that keeps tokens after unpadding ("tile": its token grid, its (row, col)
  in the tile layout, its index in pixel_values) and the "newline" tokens, with the pixel box
  each grid covers. `image_grid` is the base view's grid.
- Hooks (besides LLaVA's `vision.blocks.{i}.hook_resid_post` / `.attn.hook_z` on every tile and
  `vision.hook_image_features`, the projector input): `vision.hook_tile_embeds` [n_tiles,
  tokens_per_tile, d_model] (the projector output, HF's `multi_modal_projector` output: every
  tile of every image in pixel_values order), `vision.hook_image_newline` [d_model] (the learned
  newline vector), `vision.hook_image_embeds` [n_image_tokens, d_model] (packed: what replaces
  the placeholders, in placeholder order; newline tokens included).
- Prompt (fallback, llava-v1.6-mistral): `[INST] <image>\\n{question} [/INST]`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor
from transformers.image_processing_utils import get_patch_output_size, select_best_resolution
from transformers.image_utils import ChannelDimension

from vlens.core.architectures.base import HFModule, ImageFeatures, ImageTile, whole_image_tiles
from vlens.core.architectures.llava import LlavaAdapter
from vlens.core.architectures.registry import register_adapter
from vlens.core.components import HookedVisionTower
from vlens.core.config import VLMConfig
from vlens.core.hooks import HookPoint
from vlens.utils.errors import UserInputError


@dataclass(frozen=True)
class AnyresGeometry:
    """The tower's side of the anyres bookkeeping (from the model config).

    tile_side: the tower's input side in px (each tile's side); patch: the tower's patch side;
    pinpoints: the (height, width) resolutions an image may be tiled at; max_patches: OneVision's
    `anyres_max_N` (None: no downscaling, LLaVA-NeXT).
    """

    tile_side: int
    patch: int
    pinpoints: list
    max_patches: int | None = None

    @property
    def side(self) -> int:
        """Tokens per tile side (g)."""
        return self.tile_side // self.patch


def anyres_tiles(geometry: AnyresGeometry, image_size: tuple[int, int], base_tokens: int,
                 tiled: bool = True) -> list[ImageTile]:
    """The token records of one image, positions counted from its first token, in HF's order.

    image_size: the original (height, width) (the processor's `image_sizes` row); base_tokens: tokens
    per tile after feature selection; tiled: False for an image that gets no high-resolution tiles
    (LLaVA-OneVision's images in a multi-image prompt): its tokens, then one newline.

    Mirrors HF's `get_anyres_image_grid_shape`, `unpad_image` and (OneVision) the `anyres_max`
    downscale. After a downscale a token belongs to the tile that holds its centre, mapped back to
    the kept grid ((r + 0.5) * kept / out; a centre on a tile border goes to the later tile): the
    tile whose cells weigh most in the bilinear mix. Boxes assume the processor's tile side is the
    tower's input side (as in every released checkpoint).
    """
    height, width = int(image_size[0]), int(image_size[1])
    g = geometry.side
    if not tiled:
        tiles = whole_image_tiles(base_tokens, (g, g))
        side = max(height, width)  # the processor pads the image to a centred square
        box = (-float((side - width) // 2), -float((side - height) // 2),
               float(side - (side - width) // 2), float(side - (side - height) // 2))
        tiles = [ImageTile(t.kind, t.positions, t.grid, box=box if t.spatial else None, spatial=t.spatial)
                 for t in tiles]
        return [*tiles, ImageTile("newline", torch.tensor([base_tokens]), (1, 1), spatial=False)]
    if base_tokens != g * g:
        raise UserInputError(
            f"each tile gives {base_tokens} features but anyres packs tiles as {g}x{g} grids of patches: the "
            "vision_feature_select_strategy does not fit the tower (use 'default' with a CLIP tower, which has a CLS "
            "token, and 'full' with SigLIP, which has none), as HF requires too"
        )
    best_h, best_w = select_best_resolution((height, width), geometry.pinpoints)
    if best_h % geometry.tile_side or best_w % geometry.tile_side:
        raise UserInputError(f"image_grid_pinpoints entry {[best_h, best_w]} is not a multiple of the tower's input "
                             f"side {geometry.tile_side} px; HF cannot cut it into tiles either")
    n_rows, n_cols = best_h // geometry.tile_side, best_w // geometry.tile_side
    cur_h, cur_w = n_rows * g, n_cols * g
    row0, row1, col0, col1 = 0, cur_h, 0, cur_w  # unpad_image, on the token grid
    if width / height > cur_w / cur_h:
        padding = (cur_h - int(round(height * (cur_w / width), 7))) // 2
        row0, row1 = padding, cur_h - padding
    else:
        padding = (cur_w - int(round(width * (cur_h / height), 7))) // 2
        col0, col1 = padding, cur_w - padding
    kept_h, kept_w = row1 - row0, col1 - col0
    out_h, out_w = kept_h, kept_w
    if geometry.max_patches is not None:
        ratio = math.sqrt(kept_h * kept_w / (geometry.max_patches * g**2))
        if ratio > 1.1:
            out_h, out_w = int(kept_h // ratio), int(kept_w // ratio)

    def source(index: int, out: int, kept: int) -> int:  # the kept cell holding an output cell's centre
        return index if out == kept else min(int((index + 0.5) * kept / out), kept - 1)

    tile_row = [(row0 + source(r, out_h, kept_h)) // g for r in range(out_h)]
    tile_col = [(col0 + source(c, out_w, kept_w)) // g for c in range(out_w)]
    # pixels: the processor resizes the image into the best resolution (aspect kept) and pads it centred
    new_h, new_w = get_patch_output_size(_Shape(height, width), (best_h, best_w), ChannelDimension.FIRST)
    paste_x, paste_y = (best_w - new_w) // 2, (best_h - new_h) // 2
    # an extreme aspect ratio can leave no row or column after unpadding (only newlines, or nothing)
    px_per_out_row = kept_h / out_h * geometry.patch if out_h else 0.0
    px_per_out_col = kept_w / out_w * geometry.patch if out_w else 0.0

    def raw_x(canvas_x: float) -> float:  # canvas -> original pixels (past the image on the padding)
        return (canvas_x - paste_x) * width / new_w

    def raw_y(canvas_y: float) -> float:
        return (canvas_y - paste_y) * height / new_h

    def to_x(canvas_x: float) -> float:
        return min(max(raw_x(canvas_x), 0.0), float(width))

    def to_y(canvas_y: float) -> float:
        return min(max(raw_y(canvas_y), 0.0), float(height))

    records = [ImageTile("base", torch.arange(base_tokens), (g, g), index=0,
                         box=(0.0, 0.0, float(width), float(height)))]
    stride = out_w + 1  # each output row: out_w tokens, then a newline
    for tr in range(n_rows):
        rows = [r for r in range(out_h) if tile_row[r] == tr]
        for tc in range(n_cols):
            cols = [c for c in range(out_w) if tile_col[c] == tc]
            if not rows or not cols:
                continue  # a tile that lies wholly on the padding keeps no token
            offsets = torch.tensor([base_tokens + r * stride + c for r in rows for c in cols])
            canvas = (col0 * geometry.patch + cols[0] * px_per_out_col, row0 * geometry.patch + rows[0] * px_per_out_row,
                      col0 * geometry.patch + (cols[-1] + 1) * px_per_out_col,
                      row0 * geometry.patch + (rows[-1] + 1) * px_per_out_row)
            box = (to_x(canvas[0]), to_y(canvas[1]), to_x(canvas[2]), to_y(canvas[3]))
            # the cells divide the canvas span equally, padding included: where it runs past the image
            # (an edge row of the unpadded grid keeps a sliver of padding) the cells' full span
            extent = (raw_x(canvas[0]), raw_y(canvas[1]), raw_x(canvas[2]), raw_y(canvas[3]))
            records.append(ImageTile("tile", offsets, (len(rows), len(cols)), index=1 + tr * n_cols + tc,
                                     layout=(tr, tc), box=box, extent=None if extent == box else extent))
    newlines = torch.tensor([base_tokens + r * stride + out_w for r in range(out_h)])
    records.append(ImageTile("newline", newlines, (out_h, 1), spatial=False))
    return records


class _Shape:
    """An image stand-in for HF's `get_patch_output_size` (it only reads the shape)."""

    def __init__(self, height: int, width: int):
        self.shape = (3, height, width)
        self.ndim = 3


@register_adapter
class LlavaNextAdapter(LlavaAdapter):
    hf_class_names = ("LlavaNextForConditionalGeneration",)
    family = "llava_next"

    def build_config(self, hf_model: HFModule) -> VLMConfig:
        cfg = super().build_config(hf_model)
        self.hf_config = hf_model.config  # pinpoints are read live: HF's forward reads them from here too
        return cfg

    def geometry(self) -> AnyresGeometry:
        vision = self.hf_config.vision_config
        return AnyresGeometry(tile_side=int(vision.image_size), patch=int(vision.patch_size),
                              pinpoints=[list(p) for p in self.hf_config.image_grid_pinpoints])

    # ---- vision ----
    def build_vision(self, hf_model: HFModule) -> HookedVisionTower:
        vision = super().build_vision(hf_model)
        vision.hook_tile_embeds = HookPoint()  # [n_tiles, tokens_per_tile, d_model]: the projector output
        vision.hook_image_newline = HookPoint()  # [d_model]
        # registered here so that moving / casting the HookedVLM moves it too (the same Parameter as HF's)
        vision.image_newline = hf_model.model.image_newline
        self.hf_pack_image_features = hf_model.model.pack_image_features  # HF's own packing (read in `pack`)
        return vision

    def check_inputs(self, cfg: VLMConfig, inputs) -> None:
        pixel_values = inputs.pixel_values
        if pixel_values is not None:
            if pixel_values.ndim not in (4, 5):
                raise UserInputError(
                    f"{self.family} expects pixel_values [n_images, n_tiles, channels, height, width] (or the tiles "
                    f"of all images concatenated, 4-D), got {tuple(pixel_values.shape)}. Build inputs with "
                    "model.prepare(...) or the model's processor."
                )
            if inputs.extra.get("image_sizes") is None:
                raise UserInputError("pixel_values were given without image_sizes: anyres models need each image's "
                                     "original (height, width); pass image_sizes from the processor's output")
            counts = self.tiles_per_image(inputs)
            if pixel_values.ndim == 5:
                if pixel_values.shape[0] != len(counts):
                    raise UserInputError(f"pixel_values holds {pixel_values.shape[0]} images but image_sizes "
                                         f"{len(counts)}")
                if max(counts, default=0) > pixel_values.shape[1]:
                    raise UserInputError(f"pixel_values has {pixel_values.shape[1]} tiles per image but an image "
                                         f"needs {max(counts)}: the model's and the processor's image_grid_pinpoints "
                                         "differ")
            elif pixel_values.shape[0] != sum(counts):
                raise UserInputError(f"pixel_values holds {pixel_values.shape[0]} tiles but the images need "
                                     f"{sum(counts)}: the model's and the processor's image_grid_pinpoints differ")
        self.check_text_inputs(inputs)

    def image_sizes(self, inputs) -> list[tuple[int, int]]:
        """Each image's original (height, width), from the processor's `image_sizes`."""
        sizes = inputs.extra.get("image_sizes")
        if sizes is None:
            return []
        values = sizes.tolist() if isinstance(sizes, Tensor) else [list(s) for s in sizes]
        return [(int(h), int(w)) for h, w in values]

    def original_image_sizes(self, inputs) -> list[tuple[int, int]] | None:
        sizes = self.image_sizes(inputs)
        return [(w, h) for h, w in sizes] if sizes else None

    def tiled(self, inputs) -> list[bool]:
        """Per image: whether it is cut into high-resolution tiles (always, for LLaVA-NeXT)."""
        return [True] * len(self.image_sizes(inputs))

    def tiles_per_image(self, inputs) -> list[int]:
        """Per image: its tiles in pixel_values (base view + high-resolution tiles), as HF counts them."""
        geometry = self.geometry()
        out = []
        for size, tiled in zip(self.image_sizes(inputs), self.tiled(inputs), strict=True):
            if not tiled:
                out.append(1)
                continue
            best_h, best_w = select_best_resolution(size, geometry.pinpoints)
            # HF's image_size_to_num_patches (a ceiling division) + the base view
            out.append(-(-best_h // geometry.tile_side) * -(-best_w // geometry.tile_side) + 1)
        return out

    def flat_pixel_values(self, inputs) -> Tensor:
        """[n_tiles, C, H, W]: every image's tiles in order (the processor pads each image's tiles to the
        longest image's count; the padding is dropped, as HF does)."""
        pixel_values = inputs.pixel_values
        if pixel_values.ndim == 4:
            return pixel_values
        counts = self.tiles_per_image(inputs)
        return torch.cat([image[:n] for image, n in zip(pixel_values, counts, strict=True)])

    def tokens_per_tile(self, inputs) -> int:
        """Features per tile after selection: the patches, + CLIP's CLS with "full", - one with "default"."""
        _, strategy = self._selection(inputs)
        n_patches = self.geometry().side ** 2
        return n_patches + int(self.tower_has_cls) - (1 if strategy == "default" else 0)

    def image_layouts(self, inputs) -> list[list[ImageTile]]:
        """Per image, its token records (`anyres_tiles`), positions counted from its first token."""
        if inputs.pixel_values is None:
            return []
        geometry, per_tile = self.geometry(), self.tokens_per_tile(inputs)
        return [anyres_tiles(geometry, size, per_tile, tiled)
                for size, tiled in zip(self.image_sizes(inputs), self.tiled(inputs), strict=True)]

    def image_token_counts(self, cfg: VLMConfig, inputs) -> tuple[list[int], list[tuple[int, int]]]:
        """Per image: base view + kept tile tokens + newlines; grid: the base view's (g, g)."""
        layouts = self.image_layouts(inputs)
        counts = [sum(len(t.positions) for t in records) for records in layouts]
        return counts, [(self.geometry().side,) * 2 for _ in layouts]

    def image_tiles(self, cfg: VLMConfig, inputs) -> list[list[ImageTile]] | None:
        return self.image_layouts(inputs)

    def encode_images(self, vision: HookedVisionTower, inputs) -> ImageFeatures:
        per_tile = self.project_images(vision, inputs, self.flat_pixel_values(inputs))
        return ImageFeatures(embeds=vision.hook_image_embeds(self.pack_tiles(vision, inputs, per_tile)), deepstack=[])

    def pack_tiles(self, vision: HookedVisionTower, inputs, per_tile: Tensor) -> Tensor:
        """[n_image_tokens, d_model]: the projected tiles [n_tiles, tokens_per_tile, d_model] of every image
        packed as HF packs them (base view, unpadded tiles, newlines)."""
        per_tile = vision.get_submodule("hook_tile_embeds")(per_tile)  # [n_tiles, tokens_per_tile, d_model]
        per_image = list(torch.split(per_tile, self.tiles_per_image(inputs), dim=0))
        newline = vision.get_submodule("hook_image_newline")(vision.get_parameter("image_newline"))
        expected = [sum(len(t.positions) for t in records) for records in self.image_layouts(inputs)]
        packed = self.pack(vision, per_image, inputs, newline)
        if [len(p) for p in packed] != expected:
            raise RuntimeError(f"vlens's anyres layout ({expected} tokens per image) disagrees with HF's packing "
                               f"({[len(p) for p in packed]}) for images of sizes {self.image_sizes(inputs)}; "
                               "please report it with the model config")
        return torch.cat(packed, dim=0)

    def pack(self, vision: HookedVisionTower, per_image: list[Tensor], inputs, newline: Tensor) -> list[Tensor]:
        """HF's `pack_image_features` on the per-image tile features (base first, unpadded, newlines)."""
        _, strategy = self._selection(inputs)
        sizes = torch.tensor(self.image_sizes(inputs))
        packed, _ = self.hf_pack_image_features(per_image, sizes, vision_feature_select_strategy=strategy,
                                                image_newline=newline)
        return list(packed)

    # ---- prompts ----
    def fallback_chat_prompt(self, question: str, n_images: int) -> str:
        return "[INST] " + (self.image_placeholder() + "\n") * n_images + question + " [/INST]"

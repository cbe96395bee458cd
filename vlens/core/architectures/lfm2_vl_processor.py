"""LFM2-VL's image+text processor without torchvision (HF's `Lfm2VlImageProcessor` needs it).

The layout arithmetic is HF's, line for line (`smart_resize`, the too-large test, the tile grid chosen
by aspect ratio among `min_tiles..max_tiles` tiles); the pixels are resized with PIL's bilinear filter
(HF resizes with torchvision's antialiased bilinear: the same layout and token counts, pixel values
within resampling differences). Each image becomes:

- small enough (at most `max_image_tokens` tokens within `max_pixels_tolerance`) or splitting off: one
  tile, the whole image resized by `smart_resize` (sides multiples of patch x downsample factor, the
  pixel count within [min_image_tokens, max_image_tokens] tokens);
- larger: `rows x cols` tiles of `tile_size` px cut from the image resized to (cols x tile, rows x tile)
  (aspect ratio not kept), row-major, then (`use_thumbnail`) the `smart_resize`d whole image.

Every tile is patchified to [n_patches, patch * patch * 3] (patch rows, patch columns, then the patch's
pixels row by row, channels last) and padded to the processor's `max_num_patches`: `pixel_values`
[n_tiles, max_num_patches, 3 p^2], `pixel_attention_mask` [n_tiles, max_num_patches] (1 on real
patches), `spatial_shapes` [n_tiles, 2] (patch rows, patch columns), all images' tiles concatenated.
Each `<image>` in the text becomes ``<|image_start|>`` + (per tile ``<|img_row_r_col_c|>`` +
``<image>`` x tokens per tile, then ``<|img_thumbnail|>`` + the thumbnail's tokens) or, for one tile,
its tokens, + ``<|image_end|>``.
"""

from __future__ import annotations

import json
import math
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from transformers import BatchFeature

from vlens.core.architectures.simple_processor import SimpleVLProcessor
from vlens.utils.errors import UserInputError

_SETTINGS = ("downsample_factor", "do_image_splitting", "min_tiles", "max_tiles", "use_thumbnail", "min_image_tokens",
             "max_image_tokens", "encoder_patch_size", "tile_size", "max_pixels_tolerance", "image_mean", "image_std")


def _round_by_factor(number: float, factor: int) -> int:
    return round(number / factor) * factor


@lru_cache(maxsize=64)
def target_ratios(min_tiles: int, max_tiles: int) -> list[tuple[int, int]]:
    """The (cols, rows) tile grids with min_tiles..max_tiles tiles, fewest tiles first (HF's order)."""
    ratios = {(w, h) for n in range(min_tiles, max_tiles + 1) for w in range(1, n + 1) for h in range(1, n + 1)
              if min_tiles <= w * h <= max_tiles}
    return sorted(ratios, key=lambda x: x[0] * x[1])


def closest_aspect_ratio(width: int, height: int, ratios: list[tuple[int, int]], tile_size: int) -> tuple[int, int]:
    """HF's `find_closest_aspect_ratio`: the (cols, rows) grid nearest the image's aspect ratio; on a tie, a
    later (larger) grid when the image covers more than half of its area."""
    aspect, best, best_diff = width / height, (1, 1), float("inf")
    for ratio in ratios:
        diff = abs(aspect - ratio[0] / ratio[1])
        if diff < best_diff:
            best, best_diff = ratio, diff
        elif diff == best_diff and width * height > 0.5 * tile_size * tile_size * ratio[0] * ratio[1]:
            best = ratio
    return best


class Lfm2VlImageProcessorPil:
    """HF's `Lfm2VlImageProcessor` settings and arithmetic, PIL pixels (module docstring)."""

    def __init__(self, downsample_factor: int = 2, do_image_splitting: bool = True, min_tiles: int = 2,
                 max_tiles: int = 10, use_thumbnail: bool = True, min_image_tokens: int = 64,
                 max_image_tokens: int = 256, encoder_patch_size: int = 16, tile_size: int = 512,
                 max_pixels_tolerance: float = 2.0, image_mean: tuple[float, ...] = (0.5, 0.5, 0.5),
                 image_std: tuple[float, ...] = (0.5, 0.5, 0.5)):
        self.downsample_factor, self.do_image_splitting = int(downsample_factor), bool(do_image_splitting)
        self.min_tiles, self.max_tiles, self.use_thumbnail = int(min_tiles), int(max_tiles), bool(use_thumbnail)
        self.min_image_tokens, self.max_image_tokens = int(min_image_tokens), int(max_image_tokens)
        self.encoder_patch_size, self.tile_size = int(encoder_patch_size), int(tile_size)
        self.max_pixels_tolerance = float(max_pixels_tolerance)
        self.image_mean, self.image_std = tuple(image_mean), tuple(image_std)
        if self.do_image_splitting and self.min_tiles > self.max_tiles:
            raise UserInputError(f"min_tiles ({self.min_tiles}) must be <= max_tiles ({self.max_tiles})")

    @property
    def max_num_patches(self) -> int:
        """Every tile's patches are padded to this many (HF's: the larger of a thumbnail's and a tile's)."""
        tile = (self.tile_size // self.encoder_patch_size) ** 2 if self.do_image_splitting else 0
        return max(self.max_image_tokens * self.downsample_factor ** 2, tile)

    # ---- HF's layout arithmetic ----
    def smart_resize(self, height: int, width: int) -> tuple[int, int]:
        """(height, width) of the single-tile / thumbnail resize (HF's `smart_resize`, which returns them swapped)."""
        factor = self.encoder_patch_size * self.downsample_factor
        low = self.min_image_tokens * self.encoder_patch_size ** 2 * self.downsample_factor ** 2
        high = self.max_image_tokens * self.encoder_patch_size ** 2 * self.downsample_factor ** 2
        h_bar = max(factor, _round_by_factor(height, factor))
        w_bar = max(factor, _round_by_factor(width, factor))
        if h_bar * w_bar > high:
            beta = math.sqrt((height * width) / high)
            h_bar = max(factor, math.floor(height / beta / factor) * factor)
            w_bar = max(factor, math.floor(width / beta / factor) * factor)
        elif h_bar * w_bar < low:
            beta = math.sqrt(low / (height * width))
            h_bar = math.ceil(height * beta / factor) * factor
            w_bar = math.ceil(width * beta / factor) * factor
        return h_bar, w_bar

    def is_too_large(self, height: int, width: int) -> bool:
        factor = self.encoder_patch_size * self.downsample_factor
        h_bar = max(self.encoder_patch_size, _round_by_factor(height, factor))
        w_bar = max(self.encoder_patch_size, _round_by_factor(width, factor))
        return h_bar * w_bar > (self.max_image_tokens * self.encoder_patch_size ** 2 * self.downsample_factor ** 2
                                * self.max_pixels_tolerance)

    def split_layout(self, height: int, width: int) -> tuple[int, int, tuple[int, int]]:
        """(rows, cols) of tiles ((1, 1): not split) and the (height, width) of the single-tile / thumbnail resize."""
        resized = self.smart_resize(height, width)
        splitting = self.do_image_splitting and not self.min_tiles == self.max_tiles == 1
        if not (splitting and self.is_too_large(height, width)):
            return 1, 1, resized
        cols, rows = closest_aspect_ratio(width, height, target_ratios(self.min_tiles, self.max_tiles), self.tile_size)
        return rows, cols, resized

    def tokens(self, height: int, width: int) -> int:
        """Tokens of a (height, width) px tile (HF's processor rounds up; the model divides evenly)."""
        p, f = self.encoder_patch_size, self.downsample_factor
        return math.ceil((height // p) / f) * math.ceil((width // p) / f)

    # ---- pixels ----
    def _pixels(self, image: Image.Image) -> torch.Tensor:
        pixels = torch.from_numpy(np.asarray(image.convert("RGB"), dtype=np.float32).copy()) / 255.0
        pixels = (pixels - torch.tensor(self.image_mean)) / torch.tensor(self.image_std)
        return pixels.permute(2, 0, 1).contiguous()  # [3, H, W]

    def _patches(self, tile: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
        p = self.encoder_patch_size
        channels, height, width = tile.shape
        rows, cols = height // p, width // p
        patches = tile.reshape(channels, rows, p, cols, p).permute(1, 3, 2, 4, 0).reshape(rows * cols, -1)
        total = self.max_num_patches
        if rows * cols > total:
            raise UserInputError(f"a {height}x{width} px tile has {rows * cols} patches, more than the processor's "
                                 f"{total}: check tile_size / max_image_tokens")
        mask = torch.zeros(total, dtype=torch.int32)
        mask[: rows * cols] = 1
        return torch.nn.functional.pad(patches, (0, 0, 0, total - rows * cols)), mask, [rows, cols]

    def layout(self, image: Image.Image) -> dict[str, Any]:
        """One image's tiles (PIL, HF's order) and its (rows, cols) and thumbnail size."""
        width, height = image.size
        rows, cols, (h_bar, w_bar) = self.split_layout(height, width)
        if rows * cols == 1:
            return {"tiles": [image.resize((w_bar, h_bar), Image.Resampling.BILINEAR)], "rows": 1, "cols": 1,
                    "size": (h_bar, w_bar)}
        t = self.tile_size
        big = image.resize((cols * t, rows * t), Image.Resampling.BILINEAR)
        tiles = [big.crop((c * t, r * t, (c + 1) * t, (r + 1) * t)) for r in range(rows) for c in range(cols)]
        if self.use_thumbnail:
            tiles.append(image.resize((w_bar, h_bar), Image.Resampling.BILINEAR))
        return {"tiles": tiles, "rows": rows, "cols": cols, "size": (h_bar, w_bar)}

    def __call__(self, images: list, return_tensors: str = "pt", **_: Any) -> dict[str, Any]:
        values, masks, shapes, rows, cols, sizes = [], [], [], [], [], []
        for image in images:
            if not isinstance(image, Image.Image):
                raise UserInputError(f"the LFM2-VL processor takes PIL images, got {type(image).__name__}")
            layout = self.layout(image)
            for tile in layout["tiles"]:
                patches, mask, shape = self._patches(self._pixels(tile))
                values.append(patches)
                masks.append(mask)
                shapes.append(shape)
            rows.append(layout["rows"])
            cols.append(layout["cols"])
            sizes.append(list(layout["size"]))
        return {"pixel_values": torch.stack(values), "pixel_attention_mask": torch.stack(masks),
                "spatial_shapes": torch.tensor(shapes, dtype=torch.long), "image_rows": rows, "image_cols": cols,
                "image_sizes": sizes}

    def to_dict(self) -> dict[str, Any]:
        return {"image_processor_type": "Lfm2VlImageProcessor", **{k: getattr(self, k) for k in _SETTINGS}}

    def save_pretrained(self, folder: str) -> None:
        Path(folder, "preprocessor_config.json").write_text(json.dumps(self.to_dict(), indent=2))

    @classmethod
    def from_pretrained(cls, folder: str) -> Lfm2VlImageProcessorPil:
        path = Path(folder, "preprocessor_config.json")
        if not path.exists():
            raise UserInputError(f"{folder}: no preprocessor_config.json (the LFM2-VL image processor's settings)")
        data = json.loads(path.read_text())
        return cls(**{k: data[k] for k in _SETTINGS if k in data})


class Lfm2VlImageTextProcessor(SimpleVLProcessor):
    """HF's `Lfm2VlProcessor` image+text job without torchvision (module docstring): the same placeholders and
    model inputs; `image_rows` / `image_cols` / `image_sizes` are dropped from the output, as HF drops them."""

    def __init__(self, tokenizer: Any, image_processor: Lfm2VlImageProcessorPil, chat_template: str | None = None,
                 image_token: str = "<image>", image_start_token: str = "<|image_start|>",
                 image_end_token: str = "<|image_end|>", image_thumbnail_token: str = "<|img_thumbnail|>"):
        super().__init__(tokenizer, image_processor, chat_template=chat_template, image_token=image_token)
        self.image_start_token, self.image_end_token = image_start_token, image_end_token
        self.image_thumbnail_token = image_thumbnail_token

    def __call__(self, text: str | list[str] | None = None, images: Any = None, return_tensors: str = "pt",
                 padding: bool | str = True, **tokenizer_kwargs: Any) -> BatchFeature:
        if isinstance(images, (list, tuple)) and any(isinstance(row, (list, tuple)) for row in images):
            images = [image for row in images for image in (row if isinstance(row, (list, tuple)) else [row])]
        tokenizer_kwargs.setdefault("add_special_tokens", False)  # HF's processor adds none (the template has them)
        out = super().__call__(text=text, images=images or None, return_tensors=return_tensors, padding=padding,
                               **tokenizer_kwargs)
        for key in ("image_rows", "image_cols", "image_sizes", "mm_token_type_ids"):
            out.pop(key, None)
        return out

    def image_text(self, rows: int, cols: int, size: tuple[int, int]) -> str:
        """The placeholder text of one image (HF's `_build_image_tokens` with the special tokens)."""
        ip = self.image_processor
        thumbnail = self.image_token * ip.tokens(*size)
        if rows * cols == 1:
            return self.image_start_token + thumbnail + self.image_end_token
        per_tile = self.image_token * ip.tokens(ip.tile_size, ip.tile_size)
        parts = [f"<|img_row_{r + 1}_col_{c + 1}|>" + per_tile for r in range(rows) for c in range(cols)]
        if ip.use_thumbnail:
            parts.append(self.image_thumbnail_token + thumbnail)
        return self.image_start_token + "".join(parts) + self.image_end_token

    def _expand_placeholders(self, texts: list[str], image_inputs: dict, n_images: int) -> list[str]:
        layouts = [self.image_text(r, c, tuple(s)) for r, c, s in zip(image_inputs["image_rows"], image_inputs["image_cols"],
                                                                     image_inputs["image_sizes"], strict=True)]
        return self.expand_layouts(texts, layouts, n_images)

    def save_pretrained(self, folder: str) -> None:
        super().save_pretrained(folder)
        settings = {"processor_class": "Lfm2VlProcessor", "image_token": self.image_token,
                    "image_start_token": self.image_start_token, "image_end_token": self.image_end_token,
                    "image_thumbnail_token": self.image_thumbnail_token}
        Path(folder, "processor_config.json").write_text(json.dumps(settings, indent=2))

    @classmethod
    def from_pretrained(cls, folder: str, **kwargs: Any) -> Lfm2VlImageTextProcessor:
        """From a saved folder: its tokenizer, image processor settings, chat template and placeholder tokens."""
        from transformers import AutoTokenizer

        path = Path(folder, "processor_config.json")
        settings = json.loads(path.read_text()) if path.exists() else {}
        template_path = Path(folder, "chat_template.jinja")
        tokens = {k: settings[k] for k in ("image_token", "image_start_token", "image_end_token",
                                           "image_thumbnail_token") if k in settings}
        return cls(AutoTokenizer.from_pretrained(folder, **kwargs), Lfm2VlImageProcessorPil.from_pretrained(folder),
                   chat_template=template_path.read_text() if template_path.exists() else None, **tokens)

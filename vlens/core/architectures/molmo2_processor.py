"""Molmo 2's image+text processor without torchvision (HF's `Molmo2ImageProcessor` needs it; its video processor too).

HF's arithmetic, ported to plain torch: the same resize (bilinear, no antialiasing, in float, rounded back to
bytes: what torchvision's tensor resize computes), the same crops and pooling indices. Each image becomes:

- a low-resolution view: the whole image resized to crop_size x crop_size (aspect not kept);
- overlapping crops: the image resized to a canvas of tiling_h x tiling_w windows (`select_tiling`: the fewest
  crops, at most `max_crops`, that hold it best) plus the overlap margins, cut into crop_size squares whose
  margins overlap their neighbours';
- pixel_values [1 + n_crops, n_patches, patch^2 x 3] per image (all images' crops concatenated);
- `image_token_pooling` [n_tokens, pool_h x pool_w]: per output token, the patches it pools (indices into the
  image's own crops, low-res first; -1 pads), windows of pool_h x pool_w patches of the low-res view, then of the
  canvas with each crop's margins dropped (a patch of the canvas counted once);
- `image_grids` [n_images, 4] (low-res rows, cols, high-res rows, cols of pooled tokens), `image_num_crops`.

Each ``<|image|>`` in the text becomes ``<low_res_im_start>`` + rows of ``<im_patch>`` x cols + ``<im_col>`` +
``<im_end>``, then ``<im_start>`` + the high-res rows + ``<im_end>``; every prompt starts with the BOS (or EOS)
token; `mm_token_type_ids` is 1 on every image token (patches and structure tokens alike).
"""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from transformers import BatchFeature

from vlens.core.architectures.simple_processor import SimpleVLProcessor
from vlens.utils.errors import UserInputError

IMAGE_TOKENS = ("<im_patch>", "<im_col>", "<im_start>", "<low_res_im_start>", "<frame_start>", "<im_end>",
                "<frame_end>", "<im_low>")
_SETTINGS = ("size", "max_crops", "overlap_margins", "patch_size", "pooling_size", "image_mean", "image_std")


def select_tiling(height: int, width: int, window: int, max_crops: int) -> tuple[int, int]:
    """HF's `select_tiling`: (rows, cols) of windows; the fewest that hold the image without downscaling,
    else (all downscale) the one that downscales least; ties by tile count, then rows (float32, as HF)."""
    tilings = sorted(((h, w) for h, w in itertools.product(range(1, max_crops + 1), repeat=2) if h * w <= max_crops),
                     key=lambda x: (x[0] * x[1], x[0]))
    candidates = torch.tensor(tilings, dtype=torch.int32) * window
    scale = (candidates.to(torch.float32) / torch.tensor([height, width], dtype=torch.float32)).amin(dim=-1)
    if bool(torch.all(scale < 1)):
        return tilings[int(scale.argmax())]
    return tilings[int(torch.where(scale < 1.0, 10e9, scale).argmin())]


def pooling_windows(index_grid: torch.Tensor, pool_h: int, pool_w: int) -> tuple[torch.Tensor, int, int]:
    """HF's `arange_for_pooling`: a [h, w] patch-index grid padded with -1 (centred) to multiples of the pool,
    grouped into windows [rows * cols, pool_h * pool_w]; returns them and (rows, cols)."""
    pad_h = pool_h * ((index_grid.shape[0] + pool_h - 1) // pool_h) - index_grid.shape[0]
    pad_w = pool_w * ((index_grid.shape[1] + pool_w - 1) // pool_w) - index_grid.shape[1]
    index_grid = F.pad(index_grid, (pad_w // 2, (pad_w + 1) // 2, pad_h // 2, (pad_h + 1) // 2), value=-1)
    rows, cols = index_grid.shape[0] // pool_h, index_grid.shape[1] // pool_w
    windows = index_grid.reshape(rows, pool_h, cols, pool_w).permute(0, 2, 1, 3).reshape(rows * cols, pool_h * pool_w)
    return windows, rows, cols


class Molmo2ImageProcessorTorch:
    """HF's `Molmo2ImageProcessor` in plain torch (module docstring)."""

    def __init__(self, size: int = 378, max_crops: int = 8, overlap_margins: tuple[int, int] = (4, 4),
                 patch_size: int = 14, pooling_size: tuple[int, int] = (2, 2),
                 image_mean: tuple[float, ...] = (0.5, 0.5, 0.5), image_std: tuple[float, ...] = (0.5, 0.5, 0.5)):
        self.size, self.max_crops, self.patch_size = int(size), int(max_crops), int(patch_size)
        self.overlap_margins = tuple(int(m) for m in overlap_margins)
        self.pooling_size = tuple(int(p) for p in pooling_size)
        self.image_mean, self.image_std = tuple(image_mean), tuple(image_std)
        window = self.size // self.patch_size - sum(self.overlap_margins)
        if self.size % self.patch_size or window < 1:
            raise UserInputError(f"Molmo 2 crops of {self.size} px must be a multiple of the {self.patch_size} px "
                                 f"patch and wider than the overlap margins {list(self.overlap_margins)}")

    # ---- HF's geometry ----
    def crop_geometry(self, height: int, width: int) -> tuple[int, int, int, int]:
        """(tiling_h, tiling_w, canvas_height, canvas_width) of one image (HF's `compute_crop_geometry`)."""
        margin = sum(self.overlap_margins) * self.patch_size
        window = (self.size // self.patch_size - sum(self.overlap_margins)) * self.patch_size
        tiling_h, tiling_w = select_tiling(height - margin, width - margin, window, self.max_crops)
        return tiling_h, tiling_w, tiling_h * window + margin, tiling_w * window + margin

    def grids(self, height: int, width: int) -> tuple[tuple[int, int], tuple[int, int], int]:
        """(low-res token grid, high-res token grid, crops including the low-res view) of one image."""
        pool_h, pool_w = self.pooling_size
        tiling_h, tiling_w, canvas_h, canvas_w = self.crop_geometry(height, width)
        side = self.size // self.patch_size
        low = (math.ceil(side / pool_h), math.ceil(side / pool_w))
        high = (math.ceil((canvas_h // self.patch_size) / pool_h), math.ceil((canvas_w // self.patch_size) / pool_w))
        return low, high, tiling_h * tiling_w + 1

    # ---- pixels ----
    def _resize(self, image: torch.Tensor, height: int, width: int) -> torch.Tensor:
        """uint8 [3, H, W] -> normalized float [3, height, width]: HF's float resize, rounded back to bytes."""
        resized = F.interpolate(image.float()[None], size=(height, width), mode="bilinear", align_corners=False,
                                antialias=False)[0]
        resized = resized.round().clamp(0, 255) / 255.0
        mean, std = torch.tensor(self.image_mean)[:, None, None], torch.tensor(self.image_std)[:, None, None]
        return (resized - mean) / std

    def _patches(self, crops: torch.Tensor) -> torch.Tensor:
        """[n, S, S, C] -> [n, n_patches, p * p * C] (HF's `batch_pixels_to_patches`)."""
        n, height, width, channels = crops.shape
        p = self.patch_size
        crops = crops.reshape(n, height // p, p, width // p, p, channels).transpose(2, 3)
        return crops.reshape(n, (height // p) * (width // p), p * p * channels)

    def one_image(self, image: Image.Image) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
        """(patches [1 + n_crops, n_patches, p^2 C], pooling [n_tokens, pool_h pool_w], grid [4]) of one image."""
        pixels = torch.from_numpy(np.asarray(image.convert("RGB"), dtype=np.uint8).copy()).permute(2, 0, 1)
        height, width = pixels.shape[-2:]
        p, crop = self.patch_size, self.size
        left, right = self.overlap_margins
        crop_patches = crop // p
        window = (crop_patches - left - right) * p
        tiling_h, tiling_w, canvas_h, canvas_w = self.crop_geometry(height, width)
        canvas = self._resize(pixels, canvas_h, canvas_w)
        crops = canvas.unfold(1, crop, window).unfold(2, crop, window)  # [C, th, tw, crop, crop]
        crops = crops.permute(1, 2, 3, 4, 0).reshape(tiling_h * tiling_w, crop, crop, -1)
        index = torch.arange(tiling_h * tiling_w * crop_patches ** 2, dtype=torch.int32).reshape(
            tiling_h, tiling_w, crop_patches, crop_patches)
        if left:
            index[1:, :, :left, :] = -1
            index[:, 1:, :, :left] = -1
        if right:
            index[:-1, :, -right:, :] = -1
            index[:, :-1, :, -right:] = -1
        index = index.permute(0, 2, 1, 3).reshape(-1)
        index = index[index >= 0].reshape(canvas_h // p, canvas_w // p)
        pool_h, pool_w = self.pooling_size
        high, high_rows, high_cols = pooling_windows(index, pool_h, pool_w)
        low_view = self._resize(pixels, crop, crop).permute(1, 2, 0)[None]
        low, low_rows, low_cols = pooling_windows(
            torch.arange(crop_patches ** 2, dtype=torch.int32).reshape(crop_patches, crop_patches), pool_h, pool_w)
        high = torch.where(high >= 0, high + crop_patches ** 2, -1)
        patches = self._patches(torch.cat([low_view, crops]))
        return patches, torch.cat([low, high]).long(), [low_rows, low_cols, high_rows, high_cols]

    def __call__(self, images: list, return_tensors: str = "pt", **_: Any) -> dict[str, Any]:
        values, pooling, grids, crops = [], [], [], []
        for image in images:
            if not isinstance(image, Image.Image):
                raise UserInputError(f"the Molmo 2 processor takes PIL images, got {type(image).__name__}")
            patches, pooled, grid = self.one_image(image)
            values.append(patches)
            pooling.append(pooled)
            grids.append(grid)
            crops.append(patches.shape[0])
        return {"pixel_values": torch.cat(values), "image_token_pooling": torch.cat(pooling),
                "image_grids": torch.tensor(grids, dtype=torch.long), "image_num_crops": torch.tensor(crops)}

    def to_dict(self) -> dict[str, Any]:
        return {"image_processor_type": "Molmo2ImageProcessor", "size": {"height": self.size, "width": self.size},
                "max_crops": self.max_crops, "overlap_margins": list(self.overlap_margins),
                "patch_size": self.patch_size, "pooling_size": list(self.pooling_size),
                "image_mean": list(self.image_mean), "image_std": list(self.image_std)}

    def save_pretrained(self, folder: str) -> None:
        Path(folder, "preprocessor_config.json").write_text(json.dumps(self.to_dict(), indent=2))

    @classmethod
    def from_pretrained(cls, folder: str) -> Molmo2ImageProcessorTorch:
        path = Path(folder, "preprocessor_config.json")
        if not path.exists():
            raise UserInputError(f"{folder}: no preprocessor_config.json (the Molmo 2 image processor's settings)")
        data = {k: v for k, v in json.loads(path.read_text()).items() if k in _SETTINGS}
        size = data.pop("size", None)
        if isinstance(size, dict):
            if size.get("height") != size.get("width"):
                raise UserInputError(f"Molmo 2 crops are square; {folder} sets size {size}")
            data["size"] = size["height"]
        return cls(**data)


class Molmo2ImageTextProcessor(SimpleVLProcessor):
    """HF's `Molmo2Processor` for images and text (module docstring), without torchvision."""

    def __init__(self, tokenizer: Any, image_processor: Molmo2ImageProcessorTorch, chat_template: str | None = None,
                 image_token: str = "<|image|>", image_use_col_tokens: bool = True,
                 use_single_crop_col_tokens: bool | None = None, use_single_crop_start_token: bool = True):
        super().__init__(tokenizer, image_processor, chat_template=chat_template, image_token=image_token)
        self.image_use_col_tokens = bool(image_use_col_tokens)
        self.use_single_crop_col_tokens = use_single_crop_col_tokens
        self.use_single_crop_start_token = bool(use_single_crop_start_token)
        self.image_token_ids = [int(i) for i in tokenizer.convert_tokens_to_ids(list(IMAGE_TOKENS))]

    def image_text(self, grid: list[int]) -> str:
        """HF's `replace_image_token`: the low-res rows, then the high-res rows, each view in its start / end."""
        low_h, low_w, high_h, high_w = (int(v) for v in grid)
        high_row = "<im_patch>" * high_w + ("<im_col>" if self.image_use_col_tokens else "")
        low_cols = self.image_use_col_tokens if self.use_single_crop_col_tokens is None else self.use_single_crop_col_tokens
        low_row = "<im_patch>" * low_w + ("<im_col>" if low_cols else "")
        start = "<low_res_im_start>" if self.use_single_crop_start_token else "<im_start>"
        return start + low_row * low_h + "<im_end>" + "<im_start>" + high_row * high_h + "<im_end>"

    def __call__(self, text: str | list[str] | None = None, images: Any = None, return_tensors: str = "pt",
                 padding: bool | str = True, **tokenizer_kwargs: Any) -> BatchFeature:
        if isinstance(images, (list, tuple)) and any(isinstance(row, (list, tuple)) for row in images):
            images = [image for row in images for image in (row if isinstance(row, (list, tuple)) else [row])]
        bos = self.tokenizer.bos_token or self.tokenizer.eos_token
        texts = [text] if isinstance(text, str) else list(text or [])
        texts = [t if t.startswith(bos) else bos + t for t in texts]
        out = super().__call__(text=texts, images=images or None, return_tensors=return_tensors, padding=padding,
                               **tokenizer_kwargs)
        ids = out["input_ids"]
        out["mm_token_type_ids"] = torch.isin(ids, torch.tensor(self.image_token_ids)).long()
        return out

    def _expand_placeholders(self, texts: list[str], image_inputs: dict, n_images: int) -> list[str]:
        layouts = [self.image_text(grid) for grid in image_inputs["image_grids"].tolist()]
        return self.expand_layouts(texts, layouts, n_images)

    def save_pretrained(self, folder: str) -> None:
        super().save_pretrained(folder)
        settings = {"processor_class": "Molmo2Processor", "image_token": self.image_token,
                    "image_use_col_tokens": self.image_use_col_tokens,
                    "use_single_crop_col_tokens": self.use_single_crop_col_tokens,
                    "use_single_crop_start_token": self.use_single_crop_start_token}
        Path(folder, "processor_config.json").write_text(json.dumps(settings, indent=2))

    @classmethod
    def from_pretrained(cls, folder: str, **kwargs: Any) -> Molmo2ImageTextProcessor:
        """From a saved folder: its tokenizer, image processor settings, chat template and token layout switches."""
        from transformers import AutoTokenizer

        path = Path(folder, "processor_config.json")
        settings = json.loads(path.read_text()) if path.exists() else {}
        template_path = Path(folder, "chat_template.jinja")
        options = {k: settings[k] for k in ("image_token", "image_use_col_tokens", "use_single_crop_col_tokens",
                                           "use_single_crop_start_token") if k in settings}
        return cls(AutoTokenizer.from_pretrained(folder, **kwargs), Molmo2ImageProcessorTorch.from_pretrained(folder),
                   chat_template=template_path.read_text() if template_path.exists() else None, **options)

"""Phi-4-multimodal's image+text processor without torchvision (HF's `Phi4MultimodalImageProcessor` needs it).

The layout arithmetic is HF's, line for line (`_get_crop_layout`, `_get_crop_attention_mask`); the pixels are
resized with torch's own kernels, the ones torchvision calls (the HD resize: antialiased bilinear on the 8-bit
image, rounded back to 8 bits; the global view: bicubic without antialias on the normalised image). Each image
becomes:

- the HD image: resized, aspect ratio kept, to fit a (cols x S, rows x S) canvas (S = `size`, 448 px), the
  grid `ceil(w / S) x ceil(h / S)` or, over `dynamic_hd` crops, the nearest aspect ratio among grids of at most
  `dynamic_hd` crops, then padded with white on the right / bottom to the canvas;
- crops: the global view (the padded HD image resized to S x S) then the rows x cols S-px crops, row-major;
  `image_pixel_values` [n_images, max_crops, 3, S, S] (missing crops zero), `image_attention_mask`
  [n_images, max_crops, S / p, S / p] (0 on patches wholly in the padding; missing crops 1), `image_sizes`
  [n_images, 2] (the HD canvas' height, width);
- placeholders: with b = ceil(S / p / 2) (the 2 x 2 pooled grid side) and the kept pooled cells (h x w: those whose
  top-left patch is unmasked), h * (w + 1) sub-image tokens (a newline after every row), 1 separator,
  b * (b + 1) global-view tokens. HF's processor counts 256 + 16 for the global view, the same number at its
  default S / p = 32 (b = 16); the model's own count is used here, so that other sizes line up with the model.

Audio is refused: vlens runs the vision path only.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from transformers import BatchFeature

from vlens.core.architectures.lfm2_vl_processor import closest_aspect_ratio, target_ratios
from vlens.core.architectures.simple_processor import SimpleVLProcessor
from vlens.utils.errors import UserInputError

_SETTINGS = ("size", "patch_size", "dynamic_hd", "image_mean", "image_std")


def crop_layout(height: int, width: int, size: int, max_num: int) -> tuple[tuple[int, int], tuple[int, int],
                                                                           tuple[int, int]]:
    """HF's `_get_crop_layout`: the (cols, rows) crop grid, the (width, height) the image is resized to and the
    (width, height) of white padding that completes the grid."""
    cols, rows = math.ceil(width / size), math.ceil(height / size)
    if cols * rows > max_num:
        cols, rows = closest_aspect_ratio(width, height, target_ratios(1, max_num), size)
    target_w, target_h = size * cols, size * rows
    ratio_w, ratio_h = target_w / width, target_h / height
    if ratio_w < ratio_h:
        new_size, padding = (target_w, int(height * ratio_w)), (0, target_h - int(height * ratio_w))
    else:
        new_size, padding = (int(width * ratio_h), target_h), (target_w - int(width * ratio_h), 0)
    if min(new_size[1], target_h) < 10 or min(new_size[0], target_w) < 10:
        raise UserInputError(f"a {width} x {height} px image has too extreme an aspect ratio for Phi-4-multimodal's "
                             f"HD crops (resized to {new_size[0]} x {new_size[1]} px): crop or pad it nearer a square")
    return (cols, rows), new_size, padding


def crop_mask(grid: tuple[int, int], padding: tuple[int, int], patch_size: int, mask_size: int) -> torch.Tensor:
    """HF's `_get_crop_attention_mask`: [rows * mask_size, cols * mask_size], 0 on patch columns / rows that lie
    wholly in the padding."""
    (cols, rows), (pad_w, pad_h) = grid, padding
    mask = torch.ones(mask_size * rows, mask_size * cols)
    if pad_w >= patch_size:
        mask[:, -(pad_w // patch_size):] = 0
    if pad_h >= patch_size:
        mask[-(pad_h // patch_size):, :] = 0
    return mask


def kept_cells(mask: torch.Tensor, mask_size: int) -> tuple[int, int]:
    """(rows, cols) of pooled sub-image cells the model keeps: in each crop's pooled grid, the cells whose top-left
    patch is unmasked (the model reads each crop's mask at [0::2, 0::2], then stitches the crops)."""
    rows, cols = mask.shape[0] // mask_size, mask.shape[1] // mask_size
    pooled = mask.reshape(rows, mask_size, cols, mask_size).transpose(1, 2)[..., 0::2, 0::2]
    pooled = pooled.transpose(1, 2).reshape(rows * pooled.shape[-2], cols * pooled.shape[-1])
    return int(pooled[:, 0].sum()), int(pooled[0, :].sum())


def image_token_count(kept: tuple[int, int], base: int) -> int:
    """Sub-image cells with a newline per row, the separator, the global view with a newline per row."""
    return kept[0] * (kept[1] + 1) + 1 + base * (base + 1)


class Phi4MultimodalImageProcessorTorch:
    """HF's `Phi4MultimodalImageProcessor` settings and arithmetic, torch's resize kernels (module docstring)."""

    def __init__(self, size: int | dict = 448, patch_size: int = 14, dynamic_hd: int = 36,
                 image_mean: tuple[float, ...] = (0.5, 0.5, 0.5), image_std: tuple[float, ...] = (0.5, 0.5, 0.5)):
        if isinstance(size, dict):
            if size.get("height") != size.get("width"):
                raise UserInputError(f"Phi-4-multimodal's image processor takes square crops, got size {size}")
            size = int(size["height"])
        self.size, self.patch_size, self.dynamic_hd = int(size), int(patch_size), int(dynamic_hd)
        self.image_mean, self.image_std = tuple(float(v) for v in image_mean), tuple(float(v) for v in image_std)
        if self.size % self.patch_size:
            raise UserInputError(f"crop size {self.size} is not a multiple of patch_size {self.patch_size}")
        if self.dynamic_hd < 1:
            raise UserInputError(f"dynamic_hd (the most crops per image) must be >= 1, got {self.dynamic_hd}")

    @property
    def mask_size(self) -> int:
        return self.size // self.patch_size

    @property
    def base(self) -> int:
        """Side of a crop's pooled token grid (2 x 2 average pooling, the odd edge padded)."""
        return self.mask_size // 2 + self.mask_size % 2

    def layout(self, height: int, width: int) -> dict[str, Any]:
        """One image's crop grid (rows, cols), resized (width, height), padding (width, height), patch mask, kept
        pooled cells (rows, cols) and placeholder count."""
        grid, new_size, padding = crop_layout(height, width, self.size, self.dynamic_hd)
        mask = crop_mask(grid, padding, self.patch_size, self.mask_size)
        kept = kept_cells(mask, self.mask_size)
        return {"rows": grid[1], "cols": grid[0], "resized": new_size, "padding": padding, "mask": mask,
                "kept": kept, "tokens": image_token_count(kept, self.base)}

    def _hd_image(self, image: Image.Image, resized: tuple[int, int], padding: tuple[int, int]) -> torch.Tensor:
        """The padded HD canvas, normalised [3, rows * S, cols * S]."""
        pixels = torch.from_numpy(np.asarray(image.convert("RGB"), dtype=np.uint8).copy()).permute(2, 0, 1)
        big = F.interpolate(pixels[None].float(), size=(resized[1], resized[0]), mode="bilinear",
                            align_corners=False, antialias=True)[0]
        big = big.round().clamp(0, 255)  # torchvision resizes an 8-bit image to 8 bits
        big = F.pad(big, (0, padding[0], 0, padding[1]), value=255.0)
        mean = torch.tensor(self.image_mean).view(3, 1, 1) * 255.0  # HF folds the 1/255 rescale into mean / std
        std = torch.tensor(self.image_std).view(3, 1, 1) * 255.0
        return (big - mean) / std

    def __call__(self, images: list, return_tensors: str = "pt", **kwargs: Any) -> dict[str, Any]:
        if kwargs.get("audio") is not None or kwargs.get("audios") is not None:
            raise UserInputError("Phi-4-multimodal's audio inputs are not supported: vlens runs its vision path only.")
        crops, masks, sizes, tokens = [], [], [], []
        s, m = self.size, self.mask_size
        for image in images:
            if not isinstance(image, Image.Image):
                raise UserInputError(f"the Phi-4-multimodal processor takes PIL images, got {type(image).__name__}")
            width, height = image.size
            layout = self.layout(height, width)
            rows, cols = layout["rows"], layout["cols"]
            hd = self._hd_image(image, layout["resized"], layout["padding"])
            global_view = F.interpolate(hd[None], size=(s, s), mode="bicubic", align_corners=False)[0]
            tiles = hd.reshape(3, rows, s, cols, s).permute(1, 3, 0, 2, 4).reshape(-1, 3, s, s)
            tile_masks = layout["mask"].reshape(rows, m, cols, m).transpose(1, 2).reshape(-1, m, m)
            crops.append(torch.cat([global_view[None], tiles]))
            masks.append(torch.cat([torch.ones(1, m, m), tile_masks]))
            sizes.append([rows * s, cols * s])
            tokens.append(layout["tokens"])
        if not crops:
            raise UserInputError("the Phi-4-multimodal image processor got no images")
        most = max(c.shape[0] for c in crops)
        pixel_values = torch.stack([F.pad(c, (0, 0, 0, 0, 0, 0, 0, most - c.shape[0])) for c in crops])
        mask = torch.stack([torch.cat([k, torch.ones(most - k.shape[0], m, m)]) for k in masks])
        return {"image_pixel_values": pixel_values, "image_sizes": torch.tensor(sizes, dtype=torch.long),
                "image_attention_mask": mask, "num_img_tokens": tokens}

    def to_dict(self) -> dict[str, Any]:
        return {"image_processor_type": "Phi4MultimodalImageProcessor", "size": {"height": self.size, "width": self.size},
                **{k: getattr(self, k) for k in _SETTINGS if k != "size"}}

    def save_pretrained(self, folder: str) -> None:
        Path(folder, "preprocessor_config.json").write_text(json.dumps(self.to_dict(), indent=2))

    @classmethod
    def from_pretrained(cls, folder: str) -> Phi4MultimodalImageProcessorTorch:
        path = Path(folder, "preprocessor_config.json")
        if not path.exists():
            raise UserInputError(f"{folder}: no preprocessor_config.json (the Phi-4-multimodal image processor's "
                                 "settings)")
        data = json.loads(path.read_text())
        data = data.get("image_processor", data)  # a processor_config.json may nest it
        return cls(**{k: data[k] for k in _SETTINGS if k in data})


class Phi4MultimodalImageTextProcessor(SimpleVLProcessor):
    """HF's `Phi4MultimodalProcessor` image+text job without torchvision: each image placeholder becomes the
    image's count of placeholder tokens; the outputs are HF's keys (`image_pixel_values`, `image_sizes`,
    `image_attention_mask`; `num_img_tokens` dropped, as HF drops it). Audio is refused."""

    def __init__(self, tokenizer: Any, image_processor: Phi4MultimodalImageProcessorTorch,
                 chat_template: str | None = None, image_token: str = "<|image|>"):
        super().__init__(tokenizer, image_processor, chat_template=chat_template, image_token=image_token,
                         tokens_per_image=lambda out, index: int(out["num_img_tokens"][index]))

    def __call__(self, text: str | list[str] | None = None, images: Any = None, return_tensors: str = "pt",
                 padding: bool | str = True, **tokenizer_kwargs: Any) -> BatchFeature:
        for key in ("audio", "audios"):
            if tokenizer_kwargs.pop(key, None) is not None:
                raise UserInputError("Phi-4-multimodal's audio inputs are not supported: vlens runs its vision path "
                                     "only (images and text). Drop the audio.")
        if isinstance(images, (list, tuple)) and any(isinstance(row, (list, tuple)) for row in images):
            images = [image for row in images for image in (row if isinstance(row, (list, tuple)) else [row])]
        out = super().__call__(text=text, images=images or None, return_tensors=return_tensors, padding=padding,
                               **tokenizer_kwargs)
        for key in ("num_img_tokens", "mm_token_type_ids"):
            out.pop(key, None)
        return out

    def save_pretrained(self, folder: str) -> None:
        super().save_pretrained(folder)
        settings = {"processor_class": "Phi4MultimodalProcessor", "image_token": self.image_token}
        Path(folder, "processor_config.json").write_text(json.dumps(settings, indent=2))

    @classmethod
    def from_pretrained(cls, folder: str, **kwargs: Any) -> Phi4MultimodalImageTextProcessor:
        """From a saved folder: its tokenizer, image processor settings, chat template and image token."""
        from transformers import AutoTokenizer

        path = Path(folder, "processor_config.json")
        settings = json.loads(path.read_text()) if path.exists() else {}
        template_path = Path(folder, "chat_template.jinja")
        tokenizer = AutoTokenizer.from_pretrained(folder, **kwargs)
        image_token = settings.get("image_token") or getattr(tokenizer, "image_token", None) or "<|image|>"
        return cls(tokenizer, Phi4MultimodalImageProcessorTorch.from_pretrained(folder),
                   chat_template=template_path.read_text() if template_path.exists() else None,
                   image_token=image_token)

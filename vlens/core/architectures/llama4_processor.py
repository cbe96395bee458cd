"""Llama 4's image + text processor without torchvision (HF's `Llama4ImageProcessor` is torchvision-only).

`Llama4TileImageProcessor` does HF's layout arithmetic exactly (`find_supported_resolutions`, `get_best_fit`,
`get_max_res_without_distortion`, the upscaling limit, zero padding right / bottom, tiles row-major, a global tile
of the whole image squashed to one tile when there are several) with PIL's bilinear resize; its pixels differ
from torchvision's resize by resampling noise only (and HF normalises in bf16; here in fp32). The HF model takes
them as they are: parity tests feed the same pixel_values to both sides.

`Llama4ImageTextProcessor` expands each ``<|image|>`` as HF's `Llama4Processor._prompt_split_image`:
``<|image_start|>``, per tile row the tiles' ``<|patch|>`` runs separated by ``<|tile_x_separator|>`` and closed
by ``<|tile_y_separator|>`` (only when there are several tiles), then ``<|image|>`` and the global tile's patches,
then ``<|image_end|>``; it returns ``original_image_sizes`` [n_images, 2] (height, width) for the tile boxes
(`vlens.core.inputs.VLENS_ONLY_EXTRAS`: never passed to HF's forward, which takes no image sizes).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from vlens.core.architectures.simple_processor import SimpleVLProcessor

PREPROCESSOR_FILE = "preprocessor_config.json"


def supported_resolutions(max_chunks: int, tile: int) -> list[tuple[int, int]]:
    """HF's `find_supported_resolutions`: every (rows x tile, cols x tile) canvas of at most `max_chunks` tiles,
    in HF's order (by aspect ratio as first seen, from the most tiles down)."""
    by_ratio: dict[float, list[tuple[int, int]]] = {}
    for chunks in range(max_chunks, 0, -1):
        factors = sorted({f for i in range(1, int(chunks**0.5) + 1) if chunks % i == 0 for f in (i, chunks // i)})
        for rows in factors:
            by_ratio.setdefault(rows / (chunks // rows), []).append((rows, chunks // rows))
    return [(rows * tile, cols * tile) for value in by_ratio.values() for rows, cols in value]


def best_fit(size: tuple[int, int], resolutions: list[tuple[int, int]], to_max_canvas: bool = False) -> tuple[int, int]:
    """HF's `get_best_fit` for an image of (height, width): the canvas that needs the least upscaling (or, when
    none can be reached without downscaling, the least downscaling), the smallest area among ties."""
    table = torch.tensor(resolutions)
    scale_w = table[:, 1] / size[1]
    scale_h = table[:, 0] / size[0]
    scales = torch.where(scale_h > scale_w, scale_w, scale_h)
    up = scales[scales >= 1]
    if len(up) > 0:
        chosen = torch.max(up) if to_max_canvas else torch.min(up)
    else:
        chosen = torch.max(scales[scales < 1])
    canvas = table[scales == chosen]
    if len(canvas) > 1:
        canvas = canvas[torch.argmin(canvas[:, 0] * canvas[:, 1])][None]
    return int(canvas[0, 0]), int(canvas[0, 1])


def resized_size(size: tuple[int, int], canvas: tuple[int, int], tile: int, to_max_canvas: bool = False
                 ) -> tuple[int, int]:
    """(height, width) HF resizes an image of `size` to inside `canvas` (aspect kept, never upscaled beyond
    the tile side unless `to_max_canvas`): `get_max_res_without_distortion` of the limited target."""
    height, width = size
    target = canvas if to_max_canvas else (min(max(height, tile), canvas[0]), min(max(width, tile), canvas[1]))
    scale_w, scale_h = target[1] / width, target[0] / height
    if scale_w < scale_h:
        new_w, new_h = target[1], min(math.floor(height * scale_w), target[0])
    else:
        new_h, new_w = target[0], min(math.floor(width * scale_h), target[1])
    return max(new_h, 1), max(new_w, 1)


class Llama4TileImageProcessor:
    """Llama 4's image processor (see the module docstring) from its parameters: `size` (the tile side),
    `max_patches` (tiles per image), `resize_to_max_canvas`, `image_mean` / `image_std`."""

    def __init__(self, size: int | dict = 336, max_patches: int = 16, resize_to_max_canvas: bool = False,
                 image_mean: tuple[float, ...] = (0.5, 0.5, 0.5), image_std: tuple[float, ...] = (0.5, 0.5, 0.5)):
        self.tile = int(size["height"] if isinstance(size, dict) else size)
        self.max_patches = int(max_patches)
        self.resize_to_max_canvas = bool(resize_to_max_canvas)
        self.image_mean, self.image_std = list(image_mean), list(image_std)

    @property
    def size(self) -> dict:
        return {"height": self.tile, "width": self.tile}

    def layout(self, height: int, width: int) -> tuple[tuple[int, int], tuple[int, int]]:
        """((rows, cols) of tiles, (height, width) the image is resized to on the canvas) for an image."""
        canvas = best_fit((height, width), supported_resolutions(self.max_patches, self.tile), self.resize_to_max_canvas)
        return (canvas[0] // self.tile, canvas[1] // self.tile), resized_size((height, width), canvas, self.tile,
                                                                              self.resize_to_max_canvas)

    def _normalize(self, image: Image.Image) -> np.ndarray:
        pixels = np.asarray(image.convert("RGB"), dtype=np.float32) / 255.0
        mean, std = np.array(self.image_mean, dtype=np.float32), np.array(self.image_std, dtype=np.float32)
        return ((pixels - mean) / std).transpose(2, 0, 1)

    def __call__(self, images: list, return_tensors: str = "pt", **kwargs: Any) -> dict:
        tiles, ratios, sizes = [], [], []
        for image in images:
            if not isinstance(image, Image.Image):
                image = Image.fromarray(np.asarray(image).astype(np.uint8))
            width, height = image.size
            (rows, cols), (new_h, new_w) = self.layout(height, width)
            canvas = np.zeros((3, rows * self.tile, cols * self.tile), dtype=np.float32)
            canvas[:, :new_h, :new_w] = self._normalize(image.resize((new_w, new_h), Image.Resampling.BILINEAR))
            # HF pads with 0 before normalising: the padding is (0 - mean) / std
            pad = ((0.0 - np.array(self.image_mean)) / np.array(self.image_std)).astype(np.float32)[:, None, None]
            mask = np.zeros(canvas.shape[1:], dtype=bool)
            mask[:new_h, :new_w] = True
            padded = np.where(mask[None], canvas, pad).astype(np.float32)
            for r in range(rows):
                for c in range(cols):
                    tiles.append(padded[:, r * self.tile:(r + 1) * self.tile, c * self.tile:(c + 1) * self.tile])
            if rows * cols > 1:
                tiles.append(self._normalize(image.resize((self.tile, self.tile), Image.Resampling.BILINEAR)))
            ratios.append([rows, cols])
            sizes.append([height, width])
        return {"pixel_values": torch.from_numpy(np.stack(tiles)), "aspect_ratios": torch.tensor(ratios),
                "original_image_sizes": torch.tensor(sizes)}

    def to_dict(self) -> dict:
        return {"image_processor_type": "Llama4ImageProcessor", "size": self.size, "max_patches": self.max_patches,
                "resize_to_max_canvas": self.resize_to_max_canvas, "image_mean": self.image_mean,
                "image_std": self.image_std, "do_resize": True, "do_rescale": True, "do_normalize": True,
                "rescale_factor": 1 / 255, "resample": 2}

    def save_pretrained(self, folder: str) -> None:
        Path(folder, PREPROCESSOR_FILE).write_text(json.dumps(self.to_dict(), indent=2))

    @classmethod
    def from_pretrained(cls, folder: str) -> Llama4TileImageProcessor:
        data = json.loads(Path(folder, PREPROCESSOR_FILE).read_text())
        return cls(size=data.get("size", 336), max_patches=data.get("max_patches", 16),
                   resize_to_max_canvas=data.get("resize_to_max_canvas", False),
                   image_mean=data.get("image_mean", (0.5, 0.5, 0.5)), image_std=data.get("image_std", (0.5, 0.5, 0.5)))


class Llama4ImageTextProcessor(SimpleVLProcessor):
    """HF's `Llama4Processor` job (see the module docstring) around `Llama4TileImageProcessor`."""

    def __init__(self, tokenizer: Any, image_processor: Llama4TileImageProcessor, patch_size: int = 14,
                 pixel_shuffle_ratio: float = 0.5, chat_template: str | None = None):
        super().__init__(tokenizer, image_processor, chat_template=chat_template, image_token="<|image|>")
        self.patch_size, self.pixel_shuffle_ratio = int(patch_size), float(pixel_shuffle_ratio)
        self.patch_token_id = tokenizer.convert_tokens_to_ids("<|patch|>")

    def __call__(self, text: str | list[str] | None = None, images: Any = None, return_tensors: str = "pt",
                 padding: bool | str = True, **tokenizer_kwargs: Any):
        if isinstance(images, (list, tuple)) and any(isinstance(row, (list, tuple)) for row in images):
            images = [image for row in images for image in (row if isinstance(row, (list, tuple)) else [row])]
        out = super().__call__(text=text, images=images or None, return_tensors=return_tensors, padding=padding,
                               **tokenizer_kwargs)
        out.pop("mm_token_type_ids", None)  # HF's Llama 4 processor returns none
        out.pop("aspect_ratios", None)  # HF's forward takes none
        return out

    def patches_per_tile(self) -> int:
        side = self.image_processor.tile // self.patch_size
        return int(side * side * self.pixel_shuffle_ratio**2)

    def _expand_placeholders(self, texts: list[str], image_inputs: dict, n_images: int) -> list[str]:
        per_tile = "<|patch|>" * self.patches_per_tile()
        layouts = []
        for rows, cols in image_inputs["aspect_ratios"].tolist():
            parts = ["<|image_start|>"]
            if rows * cols > 1:
                for _ in range(rows):
                    parts.append("<|tile_x_separator|>".join([per_tile] * cols) + "<|tile_y_separator|>")
            parts += ["<|image|>", per_tile, "<|image_end|>"]
            layouts.append("".join(parts))
        return self.expand_layouts(texts, layouts, n_images)

    def save_pretrained(self, folder: str) -> None:
        super().save_pretrained(folder)
        settings = {"processor_class": "Llama4Processor", "patch_size": self.patch_size,
                    "pixel_shuffle_ratio": self.pixel_shuffle_ratio}
        Path(folder, "processor_config.json").write_text(json.dumps(settings, indent=2))

    @classmethod
    def from_pretrained(cls, folder: str, **kwargs: Any) -> Llama4ImageTextProcessor:
        """From a saved folder: its tokenizer, image processor settings, chat template, patch size and ratio (the
        processor config's, else the model config's vision settings)."""
        from transformers import AutoTokenizer

        settings: dict = {}
        for name in ("processor_config.json", "config.json"):
            path = Path(folder, name)
            if path.exists():
                data = json.loads(path.read_text())
                if name == "config.json":
                    vision = data.get("vision_config", {})
                    data = {"patch_size": vision.get("patch_size"), "pixel_shuffle_ratio": vision.get("pixel_shuffle_ratio")}
                settings = {k: v for k, v in data.items() if v is not None} | settings
        template = Path(folder, "chat_template.jinja")
        kwargs.pop("trust_remote_code", None)
        return cls(AutoTokenizer.from_pretrained(folder, **kwargs), Llama4TileImageProcessor.from_pretrained(folder),
                   patch_size=settings.get("patch_size", 14), pixel_shuffle_ratio=settings.get("pixel_shuffle_ratio", 0.5),
                   chat_template=template.read_text() if template.exists() else None)

"""The image size a model pins: one source of truth for every image vlens renders by default.

The embedded model's processor resizes every square image to one size (its folder's
preprocessor_config.json records the pixel budget that does it: `vlens.zoo.processor`), and the
images vlens draws for it by default (count pairs, task samples, the demo, the commands) are drawn
at that size rather than resized onto it:

- `embedded_image_size()`: the shipped model's size, read from its folder (cached);
- `pinned_image_size(model)`: the square size a `--model` spec, a model folder or a loaded model
  pins, or None where the processor has dynamic resolution (real Qwen2.5-VL checkpoints,
  `random-tiny`, other families);
- `render_size(model, image_size)`: the rule: an explicit size, else the pinned one, else
  `FALLBACK_IMAGE_SIZE`.

Only the standard library is imported, so the command line reads it while it runs a command's
checks without loading torch or transformers.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

from vlens.zoo.specs import resolve_spec

MODEL_NAME = "tiny-qwen2.5-vl"
WEIGHTS_FOLDER = Path(__file__).resolve().parent / "weights" / MODEL_NAME
PATCH_SIZE = 14
MERGE_SIZE = 2
CELL = PATCH_SIZE * MERGE_SIZE  # pixels per merged image token along each side
# what a model whose processor pins no square size gets rendered at (dynamic resolution: the
# processor keeps the drawn size); the embedded model's size before it moved to 196 px
FALLBACK_IMAGE_SIZE = 168
# the object tasks' (knockout, object-token and flow studies) side under dynamic resolution: small
# images, a handful of tokens
OBJECT_IMAGE_SIZE = 64


def pixel_budget(image_size: int) -> tuple[int, int]:
    """(min_pixels, max_pixels) that send every square image to image_size x image_size: half a
    28-px cell of slack each way, so HF's floating-point `smart_resize` never lands a cell off."""
    half = PATCH_SIZE
    return (image_size - half) ** 2, (image_size + half) ** 2


def pinned_side(size: Mapping[str, Any] | None) -> int | None:
    """The square side a Qwen-VL pixel budget ``{"shortest_edge": min_pixels, "longest_edge":
    max_pixels}`` pins (exactly S^2 both, or vlens's `pixel_budget(S)`), a multiple of 28 px;
    None for any other budget (dynamic resolution)."""
    if not isinstance(size, Mapping):
        return None
    low, high = size.get("shortest_edge"), size.get("longest_edge")
    if not isinstance(low, int) or not isinstance(high, int) or min(low, high) < 1:
        return None
    sides = math.isqrt(low), math.isqrt(high)
    side = sum(sides) // 2
    if sides[0] ** 2 != low or sides[1] ** 2 != high or (low != high and (low, high) != pixel_budget(side)):
        return None
    return side if side >= CELL and side % CELL == 0 else None


def _recipe_geometry(patch_size: Any, merge_size: Any) -> bool:
    return (patch_size, merge_size) == (PATCH_SIZE, MERGE_SIZE)


def folder_image_size(folder: str | Path) -> int | None:
    """The square size a model folder's preprocessor_config.json pins as vlens's recipe writes it
    (Qwen2-VL's image processor, 14-px patches merged 2 x 2); None without one (dynamic resolution,
    another family, no such file)."""
    path = Path(folder) / "preprocessor_config.json"
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    if not isinstance(config, dict) or not _recipe_geometry(config.get("patch_size"), config.get("merge_size")):
        return None
    size = config.get("size")
    if not isinstance(size, Mapping):  # older configs keep the budget as min_pixels / max_pixels
        size = {"shortest_edge": config.get("min_pixels"), "longest_edge": config.get("max_pixels")}
    return pinned_side(size)


@lru_cache(maxsize=1)
def embedded_image_size() -> int:
    """The side in px the shipped embedded model pins every square image to (its folder's processor
    config; `FALLBACK_IMAGE_SIZE` if the weights are missing)."""
    return folder_image_size(WEIGHTS_FOLDER) or FALLBACK_IMAGE_SIZE


def processor_image_size(processor: Any) -> int | None:
    """The square size a loaded processor (or its image processor) pins, else None."""
    image_processor = getattr(processor, "image_processor", processor)
    if not _recipe_geometry(getattr(image_processor, "patch_size", None), getattr(image_processor, "merge_size", None)):
        return None
    size = getattr(image_processor, "size", None)  # a dict, or transformers' SizeDict (attributes)
    edges = {key: size.get(key) if isinstance(size, Mapping) else getattr(size, key, None)
             for key in ("shortest_edge", "longest_edge")}
    return pinned_side(edges)


def pinned_image_size(model: Any) -> int | None:
    """The square size `model` pins: a `--model` spec (``tiny``: the embedded model; ``random-tiny``
    and hub ids: None), a model folder, or a loaded model / processor (its processor as configured,
    `--image-size` included). None: the processor has dynamic resolution."""
    if isinstance(model, (str, Path)):
        kind, target = resolve_spec(str(model))
        if kind == "embedded":
            return embedded_image_size()
        return folder_image_size(target) if kind == "folder" else None
    return processor_image_size(getattr(model, "processor", model))


def render_size(model: Any = None, image_size: int | None = None, fallback: int = FALLBACK_IMAGE_SIZE) -> int:
    """The side in px to render images at: `image_size` when given, else the size `model` pins
    (`pinned_image_size`; model None: the embedded model), else `fallback` (dynamic resolution)."""
    if image_size is not None:
        return image_size
    pinned = embedded_image_size() if model is None else pinned_image_size(model)
    return pinned if pinned is not None else fallback


__all__ = ["CELL", "FALLBACK_IMAGE_SIZE", "MERGE_SIZE", "MODEL_NAME", "OBJECT_IMAGE_SIZE", "PATCH_SIZE", "WEIGHTS_FOLDER",
           "embedded_image_size", "folder_image_size", "pinned_image_size", "pinned_side", "pixel_budget",
           "processor_image_size", "render_size"]

"""Drawing one object onto an image, independently of every other object.

Each object is rasterised on its own small patch (4x supersampled coverage mask, box
downsampled) and blended onto the background through that mask. A pixel therefore depends
only on the background and the one object whose footprint covers it, which is what makes
unchanged objects pixel-identical across a controlled pair.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
from PIL import Image, ImageDraw

from vlens.data.geometry import Primitive
from vlens.utils.rle import encode_mask

# a pixel belongs to an object's mask when the object covers at least half of it (of 255)
MASK_COVERAGE = 128

SUPERSAMPLE = 4


def footprint_box(center: Sequence[float], size: float) -> tuple[int, int, int, int]:
    """Pixel box (x0, y0, x1, y1), end exclusive, holding the disc of radius ``size``."""
    cx, cy = center
    x0, y0 = math.floor(cx - size), math.floor(cy - size)
    return x0, y0, math.floor(cx + size) + 1, math.floor(cy + size) + 1


def coverage_mask(
    center: Sequence[float], size: float, primitives: Sequence[Primitive]
) -> tuple[Image.Image, tuple[int, int]]:
    """Antialiased coverage of the primitives scaled by ``size`` around ``center``.

    Returns:
        (mask, (x0, y0)): an "L" image (0 = background, 255 = fully covered) over the
        footprint box, and the box's top-left corner in image pixels.
    """
    x0, y0, x1, y1 = footprint_box(center, size)
    cx, cy = center
    ss = SUPERSAMPLE
    mask = Image.new("L", ((x1 - x0) * ss, (y1 - y0) * ss), 0)
    draw = ImageDraw.Draw(mask)

    def to_patch(u: float, v: float) -> tuple[float, float]:
        return (cx + u * size - x0) * ss, (cy + v * size - y0) * ss

    for kind, geom in primitives:
        if kind == "polygon":
            draw.polygon([to_patch(u, v) for u, v in geom], fill=255)
        elif kind in ("ellipse", "ring"):
            (a, b), (c, d) = to_patch(geom[0], geom[1]), to_patch(geom[2], geom[3])
            if kind == "ellipse":
                draw.ellipse((a, b, c, d), fill=255)
            else:
                draw.ellipse((a, b, c, d), outline=255, width=max(1, round(geom[4] * size * ss)))
        else:
            raise RuntimeError(f"unknown primitive kind {kind!r}")
    return mask.reduce(ss), (x0, y0)


def paste_object(
    image: Image.Image,
    center: Sequence[float],
    size: float,
    primitives: Sequence[Primitive],
    fill: tuple[int, int, int] | Callable[[np.ndarray, np.ndarray], np.ndarray],
) -> dict:
    """Blend one object onto ``image`` in place and return where it lies.

    Args:
        fill: a flat RGB colour, or ``fill(u, v) -> uint8 [h, w, 3]`` giving the object's
            colour at pixel centres, where u, v [h, w] are unit coordinates (radius 1).

    Returns:
        {"bbox": [x0, y0, x1, y1] of the pixels the object touches (end exclusive), "mask": the
        pixels it covers at least half of, as COCO's compressed RLE over the whole image
        (`vlens.utils.rle`)}. Objects never share a pixel (`vlens.data.layout`), so the mask is
        what is visible of the object.
    """
    mask, (x0, y0) = coverage_mask(center, size, primitives)
    w, h = mask.size
    if callable(fill):
        u = (x0 + np.arange(w) + 0.5 - center[0]) / size
        v = (y0 + np.arange(h) + 0.5 - center[1]) / size
        uu, vv = np.meshgrid(u, v)
        image.paste(Image.fromarray(fill(uu, vv), "RGB"), (x0, y0), mask)
    else:
        image.paste(tuple(fill), (x0, y0, x0 + w, y0 + h), mask)
    bx0, by0, bx1, by1 = mask.getbbox() or (0, 0, 0, 0)
    return {"bbox": [x0 + bx0, y0 + by0, x0 + bx1, y0 + by1], "mask": image_mask(mask, (x0, y0), image.size)}


def image_mask(coverage: Image.Image, corner: tuple[int, int], image_size: tuple[int, int]) -> dict:
    """The whole-image RLE of the pixels a footprint's coverage ("L", at `corner`) covers at least half of."""
    width, height = image_size
    full = np.zeros((height, width), dtype=bool)
    x0, y0 = corner
    patch = np.asarray(coverage) >= MASK_COVERAGE
    ys, xs = slice(max(y0, 0), min(y0 + patch.shape[0], height)), slice(max(x0, 0), min(x0 + patch.shape[1], width))
    full[ys, xs] = patch[ys.start - y0:ys.stop - y0, xs.start - x0:xs.stop - x0]
    return encode_mask(full)

"""Training-time appearance variety, and the object under every pixel.

Held-out sets and every analysis use the data module's renderer as it is. Training images
are the same scenes (objects, layout, question, answer) redrawn the way another generator
might draw them: named colours at other shades (hue ranges around each palette colour, so
pure web colours are covered too), stars with other spikes, squashed polygons, dark
outlines, tinted / gradient / noisy backgrounds, and blur, grain or JPEG on the whole image.
The model must answer for the colour *name* and the *kind* of shape, not for our exact
pixels: whoever checks it draws their own images.

Every drawing also returns an id map (the object id of each pixel, -1 for background),
from which `vlens.recipes.embedded.vision_aux.dense_labels` makes the per-cell labels.
"""

from __future__ import annotations

import colorsys
import io
import math

import numpy as np
from jaxtyping import Int
from PIL import Image, ImageFilter

from vlens.data.backgrounds import make_background
from vlens.data.drawing import coverage_mask
from vlens.data.geometry import polygon_shape, regular_polygon, silhouette
from vlens.utils.errors import UserInputError

# Hue ranges (degrees) and (saturation, value) ranges of each colour name. The palette
# colour sits inside each range (red 0, orange 29, yellow 51, green 130, blue 227, purple
# 282 degrees), and so do the plain web colours (orange 39, yellow 60, green 120, blue 240,
# purple 300); neighbouring ranges keep a gap so a name never covers another's shade.
HUE_RANGES: dict[str, tuple[float, float]] = {
    "red": (-10.0, 8.0),
    "orange": (22.0, 40.0),
    "yellow": (48.0, 62.0),
    "green": (100.0, 150.0),
    "blue": (210.0, 245.0),
    "purple": (272.0, 305.0),
}
SATURATION_VALUE: dict[str, tuple[tuple[float, float], tuple[float, float]]] = {
    "red": ((0.7, 1.0), (0.7, 1.0)),
    "orange": ((0.8, 1.0), (0.88, 1.0)),
    "yellow": ((0.8, 1.0), (0.85, 1.0)),
    "green": ((0.6, 1.0), (0.45, 0.9)),
    "blue": ((0.6, 1.0), (0.6, 1.0)),
    "purple": ((0.55, 1.0), (0.45, 0.8)),
}
BLACK_VALUE = (0.0, 0.22)
STAR_INNER_RANGE = (0.36, 0.55)
POLY_BACKGROUND_KINDS = ("white", "white", "white", "tint", "gradient", "noise", "grey")


def shade_of(colour: str, rng: np.random.Generator) -> list[int]:
    """An RGB shade that a person still calls `colour` (a palette name)."""
    if colour == "black":
        value = rng.uniform(*BLACK_VALUE)
        return [int(round(255 * value))] * 3
    (s_lo, s_hi), (v_lo, v_hi) = SATURATION_VALUE[colour]
    hue = (rng.uniform(*HUE_RANGES[colour]) % 360.0) / 360.0
    rgb = colorsys.hsv_to_rgb(hue, rng.uniform(s_lo, s_hi), rng.uniform(v_lo, v_hi))
    return [int(round(255 * c)) for c in rgb]


def _star(rotation: float, inner: float) -> list[tuple[float, float]]:
    start = math.radians(rotation) - math.pi / 2
    return [
        ((1.0 if k % 2 == 0 else inner) * math.cos(start + math.pi * k / 5),
         (1.0 if k % 2 == 0 else inner) * math.sin(start + math.pi * k / 5))
        for k in range(10)
    ]  # fmt: skip


def canonical_primitives(obj: dict, style: str) -> list:
    """The primitives the data module draws `obj` with (SynReal-lite: its silhouette, the
    ball a disc)."""
    if style != "synreal":
        return polygon_shape(obj["shape"], obj["rotation"])
    if obj["shape"] == "ball":
        return [("ellipse", (-1.0, -1.0, 1.0, 1.0))]
    mirror = bool(np.random.default_rng([obj["appearance_seed"], 2]).integers(2))
    return silhouette(obj["shape"], mirror)


def _varied_primitives(obj: dict, rng: np.random.Generator) -> list:
    """The object's shape with other proportions: star spikes, a squash along one axis."""
    shape, rotation = obj["shape"], obj["rotation"]
    if shape == "star":
        points = _star(rotation, rng.uniform(*STAR_INNER_RANGE))
    elif shape == "circle":
        squash = rng.uniform(0.85, 1.0)
        return [("ellipse", (-1.0, -squash, 1.0, squash))]
    elif shape in ("triangle", "square", "pentagon", "hexagon"):
        points = regular_polygon({"triangle": 3, "square": 4, "pentagon": 5, "hexagon": 6}[shape], rotation)
    else:
        return polygon_shape(shape, rotation)
    scale_u, scale_v = (1.0, rng.uniform(0.8, 1.0)) if rng.random() < 0.5 else (rng.uniform(0.8, 1.0), 1.0)
    return [("polygon", [(u * scale_u, v * scale_v) for u, v in points])]


def _scaled(primitives: list, factor: float) -> list:
    scaled: list = []
    for kind, geom in primitives:
        if kind == "polygon":
            scaled.append((kind, [(u * factor, v * factor) for u, v in geom]))
        else:
            scaled.append((kind, tuple(x * factor for x in geom[:4]) + tuple(geom[4:])))
    return scaled


def _paste(image: Image.Image, id_map: np.ndarray, obj: dict, primitives: list, rgb, object_id: int) -> None:
    """Blend one flat-coloured object onto `image`; mark its covered pixels in `id_map`
    (object_id < 0: draw without marking, e.g. an outline underneath)."""
    mask, (x0, y0) = coverage_mask(obj["center"], obj["size"], primitives)
    image.paste(tuple(int(c) for c in rgb), (x0, y0, x0 + mask.size[0], y0 + mask.size[1]), mask)
    if object_id >= 0:
        _mark(id_map, mask, x0, y0, object_id)


def _mark(id_map: np.ndarray, mask: Image.Image, x0: int, y0: int, object_id: int) -> None:
    covered = np.asarray(mask) >= 128
    height, width = id_map.shape
    ys, xs = np.nonzero(covered)
    ys, xs = ys + y0, xs + x0
    inside = (ys >= 0) & (ys < height) & (xs >= 0) & (xs < width)
    id_map[ys[inside], xs[inside]] = object_id


def id_map_of(record: dict) -> Int[np.ndarray, "size size"]:
    """Object id of every pixel of a data-module image (-1: background), from the same
    primitives its renderer used."""
    size = record["image_size"]
    id_map = np.full((size, size), -1, dtype=np.int16)
    for obj in record["objects"]:
        mask, (x0, y0) = coverage_mask(obj["center"], obj["size"], canonical_primitives(obj, record["style"]))
        _mark(id_map, mask, x0, y0, obj["id"])
    return id_map


def _background(size: int, rng: np.random.Generator, dots: bool) -> Image.Image:
    kind = POLY_BACKGROUND_KINDS[int(rng.integers(len(POLY_BACKGROUND_KINDS)))]
    if dots and kind in ("noise", "gradient"):
        kind = "tint"
    if kind == "grey":
        level = int(rng.integers(200, 256))
        return Image.new("RGB", (size, size), (level, level, level))
    if kind == "noise":  # SynReal-lite's noise, lightened so every palette colour still reads
        pixels = np.asarray(make_background("noise", size, rng), dtype=np.float32)
        return Image.fromarray(np.clip(pixels * 0.5 + 127, 0, 255).astype(np.uint8), "RGB")
    return make_background(kind, size, rng)


def redraw(record: dict, rng: np.random.Generator) -> tuple[Image.Image, Int[np.ndarray, "size size"]]:
    """A SynDot / SynPoly scene redrawn with appearance variety; returns (image, id map).
    Layout, shapes, colour names (so question and answer) stay those of `record`."""
    if record["style"] not in ("syndot", "synpoly"):
        raise UserInputError(f"redraw handles syndot and synpoly scenes, not {record['style']!r}")
    size, dots = record["image_size"], record["style"] == "syndot"
    image = _background(size, rng, dots)
    id_map = np.full((size, size), -1, dtype=np.int16)
    outline = rng.random() < (0.05 if dots else 0.2)
    outline_rgb = [int(rng.integers(0, 70))] * 3
    outline_width = rng.uniform(1.0, 2.2)
    shaded = rng.random() < 0.7
    for obj in record["objects"]:
        primitives = (
            _varied_primitives(obj, rng) if rng.random() < 0.5 else canonical_primitives(obj, "synpoly")
        )
        rgb = shade_of(obj["color"], rng) if shaded else obj["rgb"]
        if outline and obj["size"] > 4:
            _paste(image, id_map, obj, primitives, outline_rgb, obj["id"])
            inner = max(0.3, 1.0 - outline_width / obj["size"])
            _paste(image, id_map, obj, _scaled(primitives, inner), rgb, -1)
        else:
            _paste(image, id_map, obj, primitives, rgb, obj["id"])
    return image, id_map


def photometric(image: Image.Image, rng: np.random.Generator) -> Image.Image:
    """Whole-image noise a foreign pipeline may add: blur, grain, JPEG (each sometimes)."""
    if rng.random() < 0.15:
        image = image.filter(ImageFilter.GaussianBlur(radius=float(rng.uniform(0.3, 1.0))))
    if rng.random() < 0.15:
        pixels = np.asarray(image, dtype=np.float32)
        noisy = pixels + rng.normal(0.0, rng.uniform(2.0, 7.0), size=pixels.shape)
        image = Image.fromarray(np.clip(np.rint(noisy), 0, 255).astype(np.uint8), "RGB")
    if rng.random() < 0.15:
        buffer = io.BytesIO()
        image.save(buffer, format="JPEG", quality=int(rng.integers(45, 95)))
        image = Image.open(io.BytesIO(buffer.getvalue())).convert("RGB")
    return image

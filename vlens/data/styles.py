"""The three visual styles: what an object looks like and how it is drawn.

A style samples an object's appearance (shape, colour, radius, rotation, appearance seed)
and draws it; placement is :mod:`vlens.data.layout`'s job and backgrounds are
:mod:`vlens.data.backgrounds`'. An object is a JSON-friendly dict::

    {"id": int, "shape": str, "color": str, "rgb": [r, g, b], "center": [x, y],
     "size": radius_px, "rotation": degrees, "appearance_seed": int, "bbox": [x0, y0, x1, y1],
     "mask": {"size": [height, width], "counts": "..."}}   # COCO compressed RLE of its pixels
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from PIL import Image

from vlens.data.backgrounds import POLY_BACKGROUNDS, REAL_BACKGROUNDS
from vlens.data.drawing import paste_object
from vlens.data.geometry import polygon_shape, silhouette
from vlens.data.palette import OBJECT_COLORS, REAL_SHAPES, SHAPES, color_rgb
from vlens.utils.errors import UserInputError


@dataclass(frozen=True)
class Style:
    """A visual style. Radii and gaps are fractions of the image side unless given in px."""

    name: str
    shapes: tuple[str, ...]
    colors: tuple[str, ...]
    radius_fraction: tuple[float, float]
    gap_fraction: float
    backgrounds: tuple[str, ...]
    default_background: str
    log_uniform_radius: bool = False  # SynReal-lite: strong scale variation
    rotates: bool = False
    count_noun: str = "objects"

    def default_radius(self, image_size: int) -> tuple[float, float]:
        lo, hi = self.radius_fraction
        return max(2.0, lo * image_size), max(2.0, hi * image_size)

    def default_min_gap(self, image_size: int) -> float:
        return max(2.0, self.gap_fraction * image_size)

    def check_attributes(self, color: str | None, shape: str | None) -> None:
        if color is not None and color not in self.colors:
            raise UserInputError(
                f"colour {color!r} is not used by style {self.name!r}; choose one of {self.colors}"
            )
        if shape is not None and shape not in self.shapes:
            raise UserInputError(
                f"shape {shape!r} is not used by style {self.name!r}; choose one of {self.shapes}"
            )

    def sample_object(
        self,
        rng: np.random.Generator,
        radius: tuple[float, float],
        color: str | None = None,
        shape: str | None = None,
    ) -> dict:
        """Appearance of one object (no centre yet); unspecified attributes are random."""
        self.check_attributes(color, shape)
        shape = shape if shape is not None else str(self.shapes[rng.integers(len(self.shapes))])
        color = color if color is not None else str(self.colors[rng.integers(len(self.colors))])
        lo, hi = radius
        if self.log_uniform_radius:
            size = float(np.exp(rng.uniform(np.log(lo), np.log(hi))))
        else:
            size = float(rng.uniform(lo, hi))
        rotation = round(float(rng.uniform(0, 360)), 1) if self.rotates else 0.0
        appearance_seed = int(rng.integers(2**31)) if self.name == "synreal" else 0
        obj = {
            "shape": shape,
            "color": color,
            "size": round(size, 2),
            "rotation": rotation,
            "appearance_seed": appearance_seed,
        }
        obj["rgb"] = self.object_rgb(color, appearance_seed)
        return obj

    def object_rgb(self, color: str, appearance_seed: int) -> list[int]:
        """The object's base RGB: the palette colour, jittered for SynReal-lite."""
        rgb = np.array(color_rgb(color), dtype=np.int64)
        if self.name == "synreal":
            rgb = rgb + np.random.default_rng([appearance_seed, 1]).integers(-25, 26, size=3)
        return [int(c) for c in np.clip(rgb, 0, 255)]

    def recolor(self, obj: dict, color: str) -> dict:
        """A copy of ``obj`` with another palette colour, everything else unchanged."""
        return {**obj, "color": color, "rgb": self.object_rgb(color, obj["appearance_seed"])}

    def draw(self, image: Image.Image, obj: dict) -> dict:
        """Draw ``obj`` onto ``image`` in place; returns its pixel "bbox" (end exclusive) and "mask" (RLE)."""
        center, size = obj["center"], obj["size"]
        if self.name != "synreal":
            return paste_object(image, center, size, polygon_shape(obj["shape"], obj["rotation"]), obj["rgb"])
        rng = np.random.default_rng([obj["appearance_seed"], 2])
        if obj["shape"] == "ball":
            return paste_object(
                image, center, size, [("ellipse", (-1, -1, 1, 1))], _shaded_sphere(obj["rgb"], rng)
            )
        mirror = bool(rng.integers(2))
        return paste_object(
            image, center, size, silhouette(obj["shape"], mirror), _textured_fill(obj["rgb"], rng)
        )


def _shaded_sphere(rgb: list[int], rng: np.random.Generator):
    """Lambert + specular shading of a sphere lit from a random upper direction."""
    light = np.array([rng.uniform(-0.7, 0.3), rng.uniform(-0.8, -0.3), 0.6])
    light /= np.linalg.norm(light)
    half = light + np.array([0.0, 0.0, 1.0])
    half /= np.linalg.norm(half)
    base = np.asarray(rgb, dtype=np.float32)

    def fill(u: np.ndarray, v: np.ndarray) -> np.ndarray:
        w = np.sqrt(np.clip(1 - u * u - v * v, 0, 1))
        diffuse = np.clip(u * light[0] + v * light[1] + w * light[2], 0, 1)
        spec = np.clip(u * half[0] + v * half[1] + w * half[2], 0, 1) ** 30
        color = base * (0.3 + 0.7 * diffuse)[..., None] + 200 * spec[..., None]
        return np.clip(np.rint(color), 0, 255).astype(np.uint8)

    return fill


def _textured_fill(rgb: list[int], rng: np.random.Generator):
    """Vertical shading, soft stripes and grain: a flat colour no longer."""
    base = np.asarray(rgb, dtype=np.float32)
    period, phase = rng.uniform(0.3, 0.8), rng.uniform(0, 2 * np.pi)
    grain_seed = int(rng.integers(2**31))

    def fill(u: np.ndarray, v: np.ndarray) -> np.ndarray:
        grain = np.random.default_rng(grain_seed).normal(0, 8, size=u.shape)
        light = 1.1 - 0.3 * (v + 1) / 2 + 0.06 * np.sin(2 * np.pi * (u + v) / period + phase)
        color = base * light[..., None] + 20 * (1 - light)[..., None] + grain[..., None]
        return np.clip(np.rint(color), 0, 255).astype(np.uint8)

    return fill


SYNDOT = Style(
    name="syndot",
    shapes=("circle",),
    colors=("black",),
    radius_fraction=(0.025, 0.055),
    gap_fraction=0.02,
    backgrounds=("white",),
    default_background="white",
    count_noun="dots",
)
SYNPOLY = Style(
    name="synpoly",
    shapes=SHAPES,
    colors=OBJECT_COLORS,
    radius_fraction=(0.045, 0.085),
    gap_fraction=0.02,
    backgrounds=POLY_BACKGROUNDS,
    default_background="white",
    rotates=True,
)
SYNREAL = Style(
    name="synreal",
    shapes=REAL_SHAPES,
    colors=OBJECT_COLORS,
    radius_fraction=(0.03, 0.11),
    gap_fraction=0.02,
    backgrounds=REAL_BACKGROUNDS,
    default_background="random",
    log_uniform_radius=True,
)
STYLES: dict[str, Style] = {s.name: s for s in (SYNDOT, SYNPOLY, SYNREAL)}


def get_style(name: str) -> Style:
    """Look a style up by name ("syndot", "synpoly", "synreal")."""
    try:
        return STYLES[name]
    except KeyError:
        raise UserInputError(f"unknown style {name!r}; choose one of {sorted(STYLES)}") from None

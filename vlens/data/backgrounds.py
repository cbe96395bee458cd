"""Backgrounds. Each depends only on (kind, size, rng), never on the objects."""

from __future__ import annotations

import numpy as np
from PIL import Image

from vlens.utils.errors import UserInputError

POLY_BACKGROUNDS: tuple[str, ...] = ("white", "tint", "gradient")
REAL_BACKGROUNDS: tuple[str, ...] = ("noise", "gradient_noise", "stripes")


def _light_color(rng: np.random.Generator, low: int, high: int) -> np.ndarray:
    return rng.integers(low, high + 1, size=3).astype(np.float32)


def _linear_gradient(rng: np.random.Generator, size: int, c0: np.ndarray, c1: np.ndarray) -> np.ndarray:
    """float32 [size, size, 3] blend from c0 to c1 along a random direction."""
    angle = rng.uniform(0, 2 * np.pi)
    coords = (np.arange(size, dtype=np.float32) + 0.5) / size - 0.5
    t = np.cos(angle) * coords[None, :] + np.sin(angle) * coords[:, None]
    t = (t - t.min()) / max(float(t.max() - t.min()), 1e-6)
    return c0 + (c1 - c0) * t[..., None]


def _smooth_noise(rng: np.random.Generator, size: int, cells: int, amplitude: float) -> np.ndarray:
    """float32 [size, size, 3] of low-frequency colour noise, zero mean-ish."""
    coarse = rng.uniform(-amplitude, amplitude, size=(cells, cells, 3)).astype(np.float32)
    channels = [
        np.asarray(Image.fromarray(coarse[..., c], "F").resize((size, size), Image.Resampling.BICUBIC)) for c in range(3)
    ]
    return np.stack(channels, axis=-1)


def _to_image(pixels: np.ndarray) -> Image.Image:
    return Image.fromarray(np.clip(np.rint(pixels), 0, 255).astype(np.uint8), "RGB")


def make_background(kind: str, size: int, rng: np.random.Generator) -> Image.Image:
    """RGB background image [size, size] of the given kind.

    Kinds: "white"; "tint" (one light pastel colour); "gradient" (two light colours);
    SynReal-lite's "noise" (smooth colour noise plus grain), "gradient_noise" and
    "stripes" (a soft periodic texture). All stay light enough for the palette's colours
    to read clearly.
    """
    if kind == "white":
        return Image.new("RGB", (size, size), (255, 255, 255))
    if kind == "tint":
        return Image.new("RGB", (size, size), tuple(int(c) for c in _light_color(rng, 215, 250)))
    if kind == "gradient":
        return _to_image(
            _linear_gradient(rng, size, _light_color(rng, 205, 255), _light_color(rng, 205, 255))
        )
    grain = rng.normal(0, 6, size=(size, size, 1)).astype(np.float32)
    if kind == "noise":
        base = _light_color(rng, 150, 225)
        return _to_image(base + _smooth_noise(rng, size, 6, 40) + grain)
    if kind == "gradient_noise":
        grad = _linear_gradient(rng, size, _light_color(rng, 120, 200), _light_color(rng, 190, 250))
        return _to_image(grad + _smooth_noise(rng, size, 4, 20) + grain)
    if kind == "stripes":
        base = _light_color(rng, 160, 230)
        period, angle = rng.uniform(8, 28), rng.uniform(0, np.pi)
        ys, xs = np.mgrid[0:size, 0:size].astype(np.float32)
        wave = np.sin(2 * np.pi * (np.cos(angle) * xs + np.sin(angle) * ys) / period)
        return _to_image(base + 14 * wave[..., None] + grain)
    raise UserInputError(
        f"unknown background {kind!r}; choose one of {POLY_BACKGROUNDS + REAL_BACKGROUNDS} or 'random'"
    )

"""Extra black-dot images in styles our SynDot renderer does not make.

The embedded model must count dots drawn by any reasonable generator, not learn one
renderer's quirks. These images vary what a foreign generator may vary: canvas size
before the resize, dot radius (per image and per dot), antialiasing (supersampled or
hard-edged), near-black ink, off-white paper, positions anywhere with a small gap.
"""

from __future__ import annotations

import numpy as np
from PIL import Image, ImageDraw

from vlens.utils.errors import UserInputError

MAX_PLACEMENT_TRIES = 2000


def _place_centres(
    rng: np.random.Generator, count: int, canvas: int, radii: np.ndarray, gap: float
) -> list[tuple[float, float]]:
    """Non-overlapping centres (pixels) inside the canvas, by rejection sampling."""
    centres: list[tuple[float, float]] = []
    for radius in radii:
        for _ in range(MAX_PLACEMENT_TRIES):
            x, y = rng.uniform(radius + 1, canvas - radius - 1, size=2)
            if all(
                (x - cx) ** 2 + (y - cy) ** 2 >= (radius + other + gap) ** 2
                for (cx, cy), other in zip(centres, radii[: len(centres)], strict=True)
            ):
                centres.append((float(x), float(y)))
                break
        else:
            raise UserInputError(f"cannot place {count} dots of radius ~{radii.mean():.1f} on {canvas} px")
    return centres


def render_dot_variant(count: int, seed: int) -> tuple[Image.Image, list[tuple[float, float]]]:
    """`count` dark dots on light paper in a style drawn from `seed`.

    Returns the RGB image (canvas 112-280 px, to be resized by the processor) and the dot
    centres in its pixels.
    """
    if not 0 <= count <= 20:
        raise UserInputError(f"count must be in 0..20, got {count}")
    rng = np.random.default_rng(seed)
    canvas = int(rng.integers(112, 281))
    scale = canvas / 168.0
    base_radius = rng.uniform(3.5, 10.0) * scale
    radii = (
        base_radius * rng.uniform(0.85, 1.15, size=count)
        if rng.random() < 0.5
        else np.full(count, base_radius)
    )
    gap = rng.uniform(2.0, 8.0) * scale
    centres = _place_centres(rng, count, canvas, radii, gap)

    paper = int(rng.integers(235, 256)) if rng.random() < 0.5 else 255
    ink = int(rng.integers(0, 50)) if rng.random() < 0.5 else 0
    supersample = 4 if rng.random() < 0.6 else 1
    image = Image.new("RGB", (canvas * supersample, canvas * supersample), (paper, paper, paper))
    draw = ImageDraw.Draw(image)
    for (x, y), radius in zip(centres, radii, strict=True):
        box = [
            (x - radius) * supersample,
            (y - radius) * supersample,
            (x + radius) * supersample,
            (y + radius) * supersample,
        ]
        draw.ellipse(box, fill=(ink, ink, ink))
    if supersample > 1:
        image = image.resize((canvas, canvas), Image.Resampling.LANCZOS)
    return image, centres

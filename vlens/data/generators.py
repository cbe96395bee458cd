"""SynDot, SynPoly and SynReal-lite: counting images, deterministic in (parameters, seed).

Each returns ``(image, record)``: an RGB PIL image and a JSON-serialisable dict with
count, objects (centre, size, colour, RGB, shape, bbox, ...), question, answer, seed,
task ("counting"), style, image size and background.
"""

from __future__ import annotations

from collections.abc import Callable

from PIL import Image

from vlens.data.scene import (
    LAYOUT_STREAM,
    Radius,
    check_count,
    check_image_size,
    counting_question,
    render_with_record,
    resolve_background,
    resolve_geometry,
    sample_objects,
    stream,
)
from vlens.data.styles import SYNDOT, SYNPOLY, SYNREAL, Style


def render_counting(
    style: Style,
    count: int,
    seed: int,
    size: int = 224,
    radius: Radius = None,
    min_gap: float | None = None,
    background: str | None = None,
    allow_empty: bool = False,
) -> tuple[Image.Image, dict]:
    """A counting image of any style with ``count`` random objects (see the render_* helpers)."""
    count, size = check_count(count, allow_empty), check_image_size(size)
    radius_px, gap = resolve_geometry(style, size, radius, min_gap)
    objects = sample_objects(style, [(None, None)] * count, stream(seed, LAYOUT_STREAM), size, radius_px, gap)
    question = counting_question(style)
    return render_with_record(
        style,
        objects,
        size,
        resolve_background(style, background, seed),
        seed,
        question=question,
        answer=str(count),
        task="counting",
        template=question,
    )


def render_syndot(
    count: int,
    seed: int,
    size: int = 224,
    radius: Radius = None,
    min_gap: float | None = None,
    allow_empty: bool = False,
) -> tuple[Image.Image, dict]:
    """Black filled circles on white, none overlapping, all fully inside.

    Args:
        count: number of dots (0 only with ``allow_empty``).
        seed: non-negative integer; same arguments and seed -> identical pixels.
        size: image side in pixels.
        radius: dot radius in px, one value or (min, max); default 2.5%-5.5% of ``size``.
        min_gap: smallest edge-to-edge distance in px (>= 2); default 2% of ``size``.
    """
    return render_counting(SYNDOT, count, seed, size, radius, min_gap, "white", allow_empty)


def render_synpoly(
    count: int,
    seed: int,
    size: int = 224,
    radius: Radius = None,
    min_gap: float | None = None,
    background: str = "white",
    allow_empty: bool = False,
) -> tuple[Image.Image, dict]:
    """Coloured polygons (see ``SHAPES``) with random rotation, size and palette colour.

    Args:
        radius: circumradius in px, one value or (min, max); default 4.5%-8.5% of ``size``.
        background: "white", "tint" (light pastel), "gradient" or "random".
        (others as :func:`render_syndot`)
    """
    return render_counting(SYNPOLY, count, seed, size, radius, min_gap, background, allow_empty)


def render_synreal(
    count: int,
    seed: int,
    size: int = 224,
    radius: Radius = None,
    min_gap: float | None = None,
    background: str = "random",
    allow_empty: bool = False,
) -> tuple[Image.Image, dict]:
    """Held-out style: shaded balls and textured silhouettes (``REAL_SHAPES``) on noisy,
    gradient or striped backgrounds, with log-uniform scale variation.

    Args:
        radius: (min, max) in px; default 3%-11% of ``size``, drawn log-uniformly.
        background: "noise", "gradient_noise", "stripes" or "random" (the default).
        (others as :func:`render_syndot`)
    """
    return render_counting(SYNREAL, count, seed, size, radius, min_gap, background, allow_empty)


RENDERERS: dict[str, Callable[..., tuple[Image.Image, dict]]] = {"syndot": render_syndot, "synpoly": render_synpoly, "synreal": render_synreal}

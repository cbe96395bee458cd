"""From a list of wanted objects to a rendered image and its record.

Randomness comes from independent numpy streams of one seed, so changing the objects
never changes the background, and the pair maker can reuse a layout exactly.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from PIL import Image

from vlens.data.backgrounds import make_background
from vlens.data.layout import place_objects
from vlens.data.styles import Style
from vlens.data.templates import COUNT_DOTS, COUNT_OBJECTS
from vlens.utils.errors import UserInputError

LAYOUT_STREAM, BACKGROUND_STREAM, QUESTION_STREAM, PAIR_STREAM = 0, 1, 2, 3

Radius = float | tuple[float, float] | None


def stream(seed: int, which: int) -> np.random.Generator:
    """The numpy Generator for one stream of a seed."""
    return np.random.default_rng([check_seed(seed), which])


def check_seed(seed: int) -> int:
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise UserInputError(f"seed must be a non-negative integer, got {seed!r}")
    return int(seed)


def check_image_size(size: int) -> int:
    if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 16:
        raise UserInputError(f"image size must be an integer >= 16 pixels, got {size!r}")
    return int(size)


def check_count(count: int, allow_empty: bool) -> int:
    if isinstance(count, bool) or not isinstance(count, (int, np.integer)) or count < 0:
        raise UserInputError(f"count must be a non-negative integer, got {count!r}")
    if count == 0 and not allow_empty:
        raise UserInputError(
            "count 0 asks for an empty image; pass allow_empty=True (CLI: --allow-empty) if you want one"
        )
    return int(count)


def resolve_radius(style: Style, image_size: int, radius: Radius) -> tuple[float, float]:
    """(min, max) object radius in px: the style's default, one value, or a range."""
    if radius is None:
        return style.default_radius(image_size)
    lo, hi = (radius, radius) if isinstance(radius, (int, float, np.number)) else radius
    if not 0 < lo <= hi:
        raise UserInputError(f"radius must be positive with min <= max, got {radius!r}")
    return float(lo), float(hi)


def resolve_geometry(
    style: Style, image_size: int, radius: Radius, min_gap: float | None
) -> tuple[tuple[float, float], float]:
    """((min, max) radius, min gap) in px, the style's defaults filling what is None."""
    gap = style.default_min_gap(image_size) if min_gap is None else float(min_gap)
    return resolve_radius(style, image_size, radius), gap


def resolve_background(style: Style, background: str | None, seed: int) -> str:
    """The background kind; "random" draws one of the style's kinds from the seed."""
    background = background or style.default_background
    if background == "random":
        return style.backgrounds[int(stream(seed, BACKGROUND_STREAM + 10).integers(len(style.backgrounds)))]
    return background


def sample_objects(
    style: Style,
    attributes: Sequence[tuple[str | None, str | None]],
    rng: np.random.Generator,
    image_size: int,
    radius: tuple[float, float],
    min_gap: float,
) -> list[dict]:
    """Objects with appearance and non-overlapping centres; ``attributes`` = (colour, shape)
    per object, None meaning random. Ids are the list positions."""
    objects = [style.sample_object(rng, radius, color, shape) for color, shape in attributes]
    centres = place_objects(rng, [o["size"] for o in objects], image_size, min_gap)
    return [
        {"id": i, **obj, "center": [float(x), float(y)]}
        for i, (obj, (x, y)) in enumerate(zip(objects, centres, strict=True))
    ]


def render_scene(
    style: Style, objects: Sequence[dict], image_size: int, background: str, seed: int
) -> tuple[Image.Image, list[dict]]:
    """Draw the objects (in order) on the seed's background.

    Returns:
        (RGB image [image_size, image_size], objects with their pixel "bbox" and "mask" (COCO RLE) filled in)
    """
    image = make_background(background, image_size, stream(seed, BACKGROUND_STREAM))
    drawn = [{**obj, **style.draw(image, obj)} for obj in objects]
    return image, drawn


def counting_question(style: Style) -> str:
    """The plain counting question of a style ("dots" for SynDot, "objects" otherwise)."""
    return COUNT_DOTS if style.count_noun == "dots" else COUNT_OBJECTS


def render_with_record(
    style: Style,
    objects: Sequence[dict],
    image_size: int,
    background: str,
    seed: int,
    *,
    question: str,
    answer: str,
    task: str,
    template: str,
    targets: list[int] | None = None,
) -> tuple[Image.Image, dict]:
    """Render the objects and build the JSON-serialisable record stored next to the image.

    ``targets`` are the ids of the objects the question is about (default: all).
    """
    image, drawn = render_scene(style, objects, image_size, background, seed)
    record = {
        "count": len(drawn),
        "question": question,
        "answer": answer,
        "task": task,
        "template": template,
        "style": style.name,
        "seed": seed,
        "image_size": image_size,
        "background": background,
        "targets": [o["id"] for o in drawn] if targets is None else sorted(targets),
        "objects": drawn,
    }
    return image, record

"""A held-out renderer for colour, shape, counting, existence and spatial questions, drawn the way someone
else's quick script would: PIL's own `regular_polygon` / `ellipse` / a star polygon, the
plain CSS colours (red 255,0,0; orange 255,165,0; yellow 255,255,0; green 0,128,0; blue
0,0,255; purple 128,0,128), a white or light-grey canvas of 160-400 px, hard or
supersampled edges, objects anywhere.

No training stage uses it (`training_set.HELD_OUT_ONLY`): its held-out accuracy says how
the model does on images it was not drawn to see. The CSS colours do fall inside the shade
ranges training uses for each colour name (vlens.recipes.embedded.appearance), so this
tests an unseen renderer, not unseen colours.
"""

from __future__ import annotations

import math

import numpy as np
from PIL import Image, ImageDraw

from vlens.data.palette import SHAPES
from vlens.data.templates import (
    ABOVE,
    COLOUR_OF_SHAPE,
    COUNT_OBJECTS,
    EXISTS_COLOR,
    EXISTS_SHAPE,
    LEFT_OF,
    NO,
    SHAPE_OF_COLOR,
    YES,
    fill,
)
from vlens.utils.errors import UserInputError

CSS_COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (255, 0, 0),
    "orange": (255, 165, 0),
    "yellow": (255, 255, 0),
    "green": (0, 128, 0),
    "blue": (0, 0, 255),
    "purple": (128, 0, 128),
}
_SIDES = {"triangle": 3, "square": 4, "pentagon": 5, "hexagon": 6}
MAX_TRIES = 500


def _draw(
    draw: ImageDraw.ImageDraw, shape: str, x: float, y: float, radius: float, rotation: float, rgb
) -> None:
    if shape == "circle":
        draw.ellipse([x - radius, y - radius, x + radius, y + radius], fill=rgb)
    elif shape == "star":
        start = math.radians(rotation) - math.pi / 2
        points = [
            (x + (radius if k % 2 == 0 else 0.42 * radius) * math.cos(start + math.pi * k / 5),
             y + (radius if k % 2 == 0 else 0.42 * radius) * math.sin(start + math.pi * k / 5))
            for k in range(10)
        ]  # fmt: skip
        draw.polygon(points, fill=rgb)
    else:
        draw.regular_polygon((x, y, radius), _SIDES[shape], rotation=rotation, fill=rgb)


def _scene(
    rng: np.random.Generator, objects: list[tuple[str, str]], radius_range: tuple[float, float]
) -> tuple[Image.Image, list[dict]]:
    canvas = int(rng.integers(160, 401))
    scale = 4 if rng.random() < 0.5 else 1
    grey = int(rng.integers(225, 256)) if rng.random() < 0.5 else 255
    radii = rng.uniform(*radius_range, size=len(objects)) * canvas
    centres: list[tuple[float, float]] = []
    for radius in radii:
        for _ in range(MAX_TRIES):
            x, y = rng.uniform(radius + 2, canvas - radius - 2, size=2)
            if all(
                math.hypot(x - cx, y - cy) > radius + other + 4
                for (cx, cy), other in zip(centres, radii, strict=False)
            ):
                centres.append((float(x), float(y)))
                break
        else:
            raise UserInputError(f"cannot place {len(objects)} objects on {canvas} px")
    image = Image.new("RGB", (canvas * scale, canvas * scale), (grey, grey, grey))
    draw = ImageDraw.Draw(image)
    records = []
    for (shape, colour), (x, y), radius in zip(objects, centres, radii, strict=True):
        rotation = float(rng.uniform(0, 360))
        _draw(draw, shape, x * scale, y * scale, radius * scale, rotation, CSS_COLOURS[colour])
        records.append({"shape": shape, "color": colour, "center": [x, y], "size": float(radius)})
    if scale > 1:
        image = image.resize((canvas, canvas), Image.Resampling.LANCZOS)
    return image, records


FOREIGN_TASKS = ("counting", "colour", "shape", "existence", "spatial")
# object radius as a share of the canvas in existence and spatial scenes: up to 6 objects must fit
SCENE_RADII = (0.05, 0.11)


def _existence(rng: np.random.Generator, colours: list[str]) -> tuple[list[tuple[str, str]], str, str]:
    """1-5 objects (the suite's range); the named shape (or colour) is on one of them or on none, each half the
    time."""
    by_shape = bool(rng.integers(2))
    pool = list(SHAPES) if by_shape else colours
    target, present = pool[int(rng.integers(len(pool)))], bool(rng.integers(2))
    others = [value for value in pool if value != target]
    n = int(rng.integers(1, 6))
    values = [target if present and i == 0 else others[int(rng.integers(len(others)))] for i in range(n)]
    objects = [(value, colours[int(rng.integers(6))]) if by_shape else (SHAPES[int(rng.integers(len(SHAPES)))], value)
               for value in values]
    question = fill(EXISTS_SHAPE, shape=target) if by_shape else fill(EXISTS_COLOR, color=target)
    return objects, question, YES if present else NO


def _spatial(rng: np.random.Generator, colours: list[str]) -> tuple[Image.Image, dict]:
    """2-6 objects (the suite's range) of distinct (colour, shape); asks about two whose footprints do not overlap
    along the axis (left of: x; above: y), so no answer is borderline; the scene is redrawn until such a pair
    exists."""
    n = int(rng.integers(2, 7))
    combos = [(shape, colour) for shape in SHAPES for colour in colours]
    objects = [combos[i] for i in rng.choice(len(combos), size=n, replace=False)]
    template = LEFT_OF if rng.random() < 0.5 else ABOVE
    axis = 0 if template == LEFT_OF else 1
    for _ in range(MAX_TRIES):
        image, records = _scene(rng, objects, SCENE_RADII)
        pairs = [(a, b) for a in records for b in records
                 if a is not b and abs(a["center"][axis] - b["center"][axis]) >= a["size"] + b["size"]]
        if pairs:
            a, b = pairs[int(rng.integers(len(pairs)))]
            question = fill(template, color=a["color"], shape=a["shape"], color2=b["color"], shape2=b["shape"])
            answer = YES if a["center"][axis] < b["center"][axis] else NO
            return image, {"task": "spatial", "question": question, "answer": answer, "objects": records,
                           "pair": [records.index(a), records.index(b)]}
    raise UserInputError(f"no two of {n} objects clearly apart along the {'x' if axis == 0 else 'y'} axis")


def foreign_sample(task: str, seed: int) -> tuple[Image.Image, dict]:
    """One held-out (image, record) of `task` (one of FOREIGN_TASKS)."""
    rng = np.random.default_rng([seed, 31])
    colours = list(CSS_COLOURS)
    if task == "spatial":
        image, record = _spatial(rng, colours)
        return image, {**record, "seed": seed}
    if task == "existence":
        objects, question, answer = _existence(rng, colours)
        image, records = _scene(rng, [objects[i] for i in rng.permutation(len(objects))], SCENE_RADII)
        return image, {"task": task, "question": question, "answer": answer, "objects": records, "seed": seed}
    if task == "counting":
        count = 1 + seed % 10
        objects = [
            (SHAPES[int(rng.integers(len(SHAPES)))], colours[int(rng.integers(6))]) for _ in range(count)
        ]
        image, records = _scene(rng, objects, (0.035, 0.06))
        return image, {"task": "counting", "question": COUNT_OBJECTS, "answer": str(count), "count": count,
                       "objects": records, "seed": seed}  # fmt: skip
    n = int(rng.integers(1, 5))
    shapes = [SHAPES[i] for i in rng.permutation(len(SHAPES))[:n]]
    picked = [colours[i] for i in rng.permutation(6)[:n]]
    if task == "colour":  # distinct shapes: "the star" is unique
        objects = [(shape, colours[int(rng.integers(6))]) for shape in shapes]
        question, answer = fill(COLOUR_OF_SHAPE, shape=objects[0][0]), objects[0][1]
    elif task == "shape":  # distinct colours: "the red object" is unique
        objects = [(SHAPES[int(rng.integers(len(SHAPES)))], colour) for colour in picked]
        question, answer = fill(SHAPE_OF_COLOR, color=objects[0][1]), objects[0][0]
    else:
        raise UserInputError(f"foreign renderer tasks are {', '.join(FOREIGN_TASKS)}, not {task!r}")
    order = rng.permutation(n)  # the asked-about object is not always drawn first
    image, records = _scene(rng, [objects[i] for i in order], (0.06, 0.14))
    return image, {"task": task, "question": question, "answer": answer, "objects": records, "seed": seed}

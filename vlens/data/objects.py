"""Object tasks: name an object, say the colour of the object in a corner (for object-token studies).

    image, record = make_object_sample("name", seed=0, size=64)
    record["question"]   # "What is the object in the image?"
    record["answer"]     # its shape, e.g. "hexagon"
    record["objects"][record["targets"][0]]["bbox"]   # [x0, y0, x1, y1] in pixels: the object's box

Tasks (`OBJECT_TASKS`):

- "name": one object of a random shape and colour; "What is the object in the image?" -> its shape
  (Neo et al., ICLR 2025, ask a VLM to identify the object whose tokens they ablate);
- "colour_at": two to four objects of distinct colours, at most one per image quadrant, each wholly
  inside its quadrant; "What colour is the object at the top left?" (a quadrant holding one) -> its colour.

The questions are not in the task suites' `TEMPLATES` (the embedded model's tokenizer is built from
those and was trained on them: it knows neither "image", "top", "bottom", "right" nor "at", which it
reads as its unknown token). Deterministic in (arguments, seed); the record is the task suites'
(`render_with_record`), "targets" the asked object's id.
"""

from __future__ import annotations

from PIL import Image

from vlens.data.scene import (
    LAYOUT_STREAM,
    QUESTION_STREAM,
    check_image_size,
    render_with_record,
    resolve_background,
    resolve_geometry,
    sample_objects,
    stream,
)
from vlens.data.styles import get_style
from vlens.utils.errors import UserInputError

NAME_OBJECT = "What is the object in the image?"
COLOUR_AT = "What colour is the object at the {corner}?"
OBJECT_TASKS: dict[str, str] = {"name": NAME_OBJECT, "colour_at": COLOUR_AT}
CORNERS = ("top left", "top right", "bottom left", "bottom right")
LAYOUT_ATTEMPTS = 100


def quadrant(bbox, size: int) -> str | None:
    """The corner name of the image quadrant that wholly holds `bbox` [x0, y0, x1, y1], or None."""
    x0, y0, x1, y1 = bbox
    half = size / 2
    horizontal = "left" if x1 <= half else "right" if x0 >= half else None
    vertical = "top" if y1 <= half else "bottom" if y0 >= half else None
    return None if horizontal is None or vertical is None else f"{vertical} {horizontal}"


def make_object_sample(task: str, seed: int, size: int = 224, style: str = "synpoly",
                       background: str | None = None) -> tuple[Image.Image, dict]:
    """One image and question of an object task (`OBJECT_TASKS`); see the module docstring.

    Returns (RGB image [size, size], record): the record holds "question", "answer", "task",
    "template", "targets" (the asked object's id) and "objects" (each with its pixel "bbox").
    """
    if task not in OBJECT_TASKS:
        raise UserInputError(f"unknown object task {task!r}; choose one of {', '.join(OBJECT_TASKS)}")
    size, the_style = check_image_size(size), get_style(style)
    if the_style.count_noun == "dots":
        raise UserInputError(f"object tasks need shapes of several kinds: use style 'synpoly' or 'synreal', not {style!r}")
    q_rng, layout_rng = stream(seed, QUESTION_STREAM), stream(seed, LAYOUT_STREAM)
    radius, gap = resolve_geometry(the_style, size, None, None)
    background_kind = resolve_background(the_style, background, seed)
    if task == "name":
        shape = str(the_style.shapes[int(q_rng.integers(len(the_style.shapes)))])
        color = str(the_style.colors[int(q_rng.integers(len(the_style.colors)))])
        objects = sample_objects(the_style, [(color, shape)], layout_rng, size, radius, gap)
        return render_with_record(the_style, objects, size, background_kind, seed, question=NAME_OBJECT,
                                  answer=shape, task="name", template=NAME_OBJECT, targets=[0])
    n = int(q_rng.integers(2, 5))
    colors = [str(c) for c in q_rng.choice(the_style.colors, size=n, replace=False)]
    for _ in range(LAYOUT_ATTEMPTS):
        objects = sample_objects(the_style, [(c, None) for c in colors], layout_rng, size, radius, gap)
        # the drawn box is known after rendering: render, then keep layouts with one object per quadrant
        image, record = render_with_record(the_style, objects, size, background_kind, seed, question="",
                                           answer="", task="colour_at", template=COLOUR_AT)
        corners = [quadrant(o["bbox"], size) for o in record["objects"]]
        if None in corners or len(set(corners)) != len(corners):
            continue
        target = int(q_rng.integers(n))
        record.update(question=COLOUR_AT.format(corner=corners[target]), answer=colors[target], targets=[target])
        return image, record
    raise UserInputError(f"no layout in {LAYOUT_ATTEMPTS} attempts put one object in each of {n} quadrants; "
                         "use a larger image")

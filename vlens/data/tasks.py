"""Task suites for cross-task head analysis: one image + one templated question each.

Every task picks the objects' colours and shapes so that its question has exactly one
answer (a unique target, or a spatial relation with clearly separated objects), lays them
out, renders, and fills in the template. Deterministic in (arguments, seed).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
from PIL import Image

from vlens.data import templates as T
from vlens.data.palette import plural
from vlens.data.scene import (
    LAYOUT_STREAM,
    QUESTION_STREAM,
    Radius,
    check_image_size,
    render_with_record,
    resolve_background,
    resolve_geometry,
    sample_objects,
    stream,
)
from vlens.data.styles import Style, get_style
from vlens.utils.errors import UserInputError

DEFAULT_COUNTS: tuple[int, ...] = tuple(range(1, 11))
MAX_SPATIAL_OBJECTS = 6
MAX_ATTRIBUTE_OBJECTS = 5
LAYOUT_ATTEMPTS = 50

Attributes = list[tuple[str | None, str | None]]
# objects (with ids and centres) -> (question, answer, target ids), or None if the layout
# does not allow an unambiguous question (then a new layout is drawn).
Asker = Callable[[list[dict]], tuple[str, str, list[int]] | None]


def _pick(rng: np.random.Generator, items: Sequence):
    return items[int(rng.integers(len(items)))]


def _without(items: Sequence[str], *excluded: str) -> list[str]:
    return [x for x in items if x not in excluded]


def _ids(objects: list[dict], key: str, value: str) -> list[int]:
    return [o["id"] for o in objects if o[key] == value]


def _counting(
    style: Style, template: str, rng: np.random.Generator, counts: Sequence[int], distractors: int | None = None,
    distractor_kinds: int | None = None,
) -> tuple[Attributes, Asker]:
    n = int(_pick(rng, counts))
    if template in (T.COUNT_DOTS, T.COUNT_OBJECTS):
        blank: Attributes = [(None, None)] * n
        return blank, lambda objs: (template, str(n), [o["id"] for o in objs])
    key, pool = ("color", style.colors) if template == T.COUNT_COLOR else ("shape", style.shapes)
    target = _pick(rng, pool)
    extra = int(rng.integers(0, max(counts) - n + 1)) if distractors is None else distractors
    others = _without(pool, target)
    if distractor_kinds is not None:  # a few other values, drawn once: the distractors form groups
        others = [others[i] for i in sorted(rng.choice(len(others), size=min(distractor_kinds, len(others)),
                                                       replace=False))]
    values = [target] * n + [_pick(rng, others) for _ in range(extra)]
    attrs: Attributes = [(v, None) if key == "color" else (None, v) for v in values]
    question = T.fill(template, color=target, shape_plural=plural(target))
    return attrs, lambda objs: (question, str(n), _ids(objs, key, target))


def _colour(
    style: Style, template: str, rng: np.random.Generator, counts: Sequence[int]
) -> tuple[Attributes, Asker]:
    shape, color = _pick(rng, style.shapes), _pick(rng, style.colors)
    n_other = int(rng.integers(0, min(MAX_ATTRIBUTE_OBJECTS, max(counts))))
    attrs = [(color, shape)] + [(None, _pick(rng, _without(style.shapes, shape))) for _ in range(n_other)]
    return attrs, lambda objs: (T.fill(template, shape=shape), color, _ids(objs, "shape", shape))


def _shape(
    style: Style, template: str, rng: np.random.Generator, counts: Sequence[int]
) -> tuple[Attributes, Asker]:
    shape, color = _pick(rng, style.shapes), _pick(rng, style.colors)
    n_other = int(rng.integers(0, min(MAX_ATTRIBUTE_OBJECTS, max(counts))))
    attrs = [(color, shape)] + [(_pick(rng, _without(style.colors, color)), None) for _ in range(n_other)]
    return attrs, lambda objs: (T.fill(template, color=color), shape, _ids(objs, "color", color))


def _spatial(
    style: Style, template: str, rng: np.random.Generator, counts: Sequence[int]
) -> tuple[Attributes, Asker]:
    n = int(rng.integers(2, min(MAX_SPATIAL_OBJECTS, max(counts)) + 1))
    combos = [(c, s) for c in style.colors for s in style.shapes]
    attrs = [combos[i] for i in rng.choice(len(combos), size=n, replace=False)]
    axis = 0 if template == T.LEFT_OF else 1

    def ask(objs: list[dict]):
        # only pairs whose footprints do not overlap along the axis: no borderline answers
        pairs = [
            (a, b)
            for a in objs
            for b in objs
            if a["id"] != b["id"] and abs(a["center"][axis] - b["center"][axis]) >= a["size"] + b["size"]
        ]
        if not pairs:
            return None
        a, b = pairs[int(rng.integers(len(pairs)))]
        question = T.fill(template, color=a["color"], shape=a["shape"], color2=b["color"], shape2=b["shape"])
        answer = T.YES if a["center"][axis] < b["center"][axis] else T.NO
        return question, answer, [a["id"], b["id"]]

    return attrs, ask


def _arithmetic(
    style: Style, template: str, rng: np.random.Generator, counts: Sequence[int]
) -> tuple[Attributes, Asker]:
    total = max(counts)
    if total < 2:
        raise UserInputError("arithmetic questions need counts up to at least 2")
    c1, c2 = (str(c) for c in rng.choice(style.colors, size=2, replace=False))
    k1 = int(rng.integers(1, total))  # 1..total-1, leaving room for at least one c2 object
    k2 = (
        int(rng.integers(1, min(k1, total - k1) + 1))
        if template == T.DIFFERENCE_OF_COLORS
        else int(rng.integers(1, total - k1 + 1))
    )
    extra = int(rng.integers(0, min(3, total - k1 - k2) + 1))
    others = _without(style.colors, c1, c2)
    attrs = [(c1, None)] * k1 + [(c2, None)] * k2 + [(_pick(rng, others), None) for _ in range(extra)]
    answer = str(k1 + k2) if template == T.SUM_OF_COLORS else str(k1 - k2)
    question = T.fill(template, color=c1, color2=c2)
    return attrs, lambda objs: (question, answer, _ids(objs, "color", c1) + _ids(objs, "color", c2))


def _existence(
    style: Style, template: str, rng: np.random.Generator, counts: Sequence[int]
) -> tuple[Attributes, Asker]:
    key, pool = ("shape", style.shapes) if template == T.EXISTS_SHAPE else ("color", style.colors)
    target, present = _pick(rng, pool), bool(rng.integers(2))
    n = int(rng.integers(1, min(MAX_ATTRIBUTE_OBJECTS, max(counts)) + 1))
    values = [target if present and i == 0 else _pick(rng, _without(pool, target)) for i in range(n)]
    attrs: Attributes = [(v, None) if key == "color" else (None, v) for v in values]
    question = T.fill(template, shape=target, color=target)
    return attrs, lambda objs: (question, T.YES if present else T.NO, _ids(objs, key, target))


_BUILDERS = {
    "counting": _counting,
    "colour": _colour,
    "shape": _shape,
    "spatial": _spatial,
    "arithmetic": _arithmetic,
    "existence": _existence,
}


def _check_distractors(task: str, template: str, distractors: object, kinds: object = None) -> None:
    """`distractors` only where a question counts a subset (by colour or shape), as a count."""
    if task != "counting" or template not in (T.COUNT_COLOR, T.COUNT_SHAPE):
        raise UserInputError(
            f"distractors apply to counting by colour or shape ({T.COUNT_COLOR!r}, {T.COUNT_SHAPE!r}), "
            f"not to task {task!r} with template {template!r}; leave distractors=None"
        )
    if isinstance(distractors, bool) or not isinstance(distractors, int) or distractors < 0:
        raise UserInputError(f"distractors must be a non-negative integer, got {distractors!r}")
    if kinds is not None and (isinstance(kinds, bool) or not isinstance(kinds, int) or kinds < 1):
        raise UserInputError(f"distractor_kinds must be a positive integer or None, got {kinds!r}")


def task_templates(task: str, style: str) -> tuple[str, ...]:
    """The templates a task uses in a style (SynDot counts dots; the others count objects)."""
    if task not in _BUILDERS:
        raise UserInputError(f"unknown task {task!r}; choose one of {T.TASKS}")
    if style == "syndot":
        if task != "counting":
            raise UserInputError(
                f"task {task!r} needs coloured shapes: use style 'synpoly' or 'synreal', not 'syndot'"
            )
        return (T.COUNT_DOTS,)
    return tuple(t for t in T.TEMPLATES[task] if t != T.COUNT_DOTS)


def make_task_sample(
    task: str,
    seed: int,
    size: int = 224,
    style: str = "synpoly",
    counts: Sequence[int] = DEFAULT_COUNTS,
    template: str | None = None,
    radius: Radius = None,
    min_gap: float | None = None,
    background: str | None = None,
    distractors: int | None = None,
    distractor_kinds: int | None = None,
) -> tuple[Image.Image, dict]:
    """One image and question of a task suite.

    Args:
        task: one of :data:`TASKS`.
        seed: non-negative integer; same arguments and seed -> identical sample.
        style: "synpoly" (default), "synreal", or "syndot" (counting only).
        counts: allowed object counts (counting answers; others stay within max(counts)).
        template: one of ``TEMPLATES[task]``; default a random one from the seed.
        distractors: counting by colour or shape only ("How many red objects are there?"):
            exactly this many objects that do not match the question, each of another colour
            (shape) than the asked one; default a random number from 0 up to max(counts) - answer,
            so that a fixed count (``counts=(n,)``) draws none. Recorded as "distractors".
        distractor_kinds: with ``distractors``: draw them from only this many other colours (shapes),
            so that they form groups; 1 makes them one group of ``distractors`` objects, which can
            outnumber the asked ones (default: each distractor's value drawn on its own).

    Returns:
        (RGB image, record) where the record also has "template" and "targets" (ids of the
        objects the question is about).
    """
    size, the_style = check_image_size(size), get_style(style)
    allowed = task_templates(task, style)
    counts = sorted({int(c) for c in counts})
    if not counts or counts[0] < 1:
        raise UserInputError(f"task counts must be positive integers, got {counts}")
    q_rng, layout_rng = stream(seed, QUESTION_STREAM), stream(seed, LAYOUT_STREAM)
    if template is None:
        template = _pick(q_rng, allowed)
    elif template not in allowed:
        raise UserInputError(
            f"template {template!r} is not one of task {task!r}'s templates for {style}: {allowed}"
        )
    radius_px, gap = resolve_geometry(the_style, size, radius, min_gap)
    if distractors is None and distractor_kinds is not None:
        raise UserInputError("distractor_kinds groups the distractors: give distractors too")
    if distractors is None:
        attributes, ask = _BUILDERS[task](the_style, template, q_rng, counts)
    else:
        _check_distractors(task, template, distractors, distractor_kinds)
        attributes, ask = _counting(the_style, template, q_rng, counts, distractors, distractor_kinds)
    for _ in range(LAYOUT_ATTEMPTS):
        order = q_rng.permutation(len(attributes))  # targets are not always the first ids
        objects = sample_objects(the_style, [attributes[i] for i in order], layout_rng, size, radius_px, gap)
        asked = ask(objects)
        if asked is not None:
            break
    else:
        raise UserInputError(
            f"no layout in {LAYOUT_ATTEMPTS} attempts allowed an unambiguous {task!r} question; "
            "use a larger image or smaller objects"
        )
    question, answer, targets = asked
    background = resolve_background(the_style, background, seed)
    image, record = render_with_record(
        the_style,
        objects,
        size,
        background,
        seed,
        question=question,
        answer=answer,
        task=task,
        template=template,
        targets=targets,
    )
    if distractors is not None:
        record["distractors"] = distractors
    if distractor_kinds is not None:
        record["distractor_kinds"] = distractor_kinds
    return image, record

"""Minimal pairs for the binding questions: the same image asked a second question whose
answer differs only because the noun differs.

A batch that holds both "Is there a red object?" -> yes and "Is there a blue object?" -> no
about one image cannot be fitted by the answer prior or by any function of the image alone:
the loss falls only once the answer depends on the noun. This is the pressure the binding
tasks lacked (RESULTS.md, issue 40: existence sat at its prior for ~800 steps of batch 48).

Counterparts, from the sample's record (objects with colour, shape, centre):
- existence: the question about a value absent from the image when the answer is "yes", about
  a present one when it is "no" (same template);
- spatial: the two objects swapped (their footprints are separated along the axis, so the
  answer flips);
- colour / shape: another object whose shape (colour) is unique in the image, asked the same way;
- counting among distractors (a record drawn with explicit "distractors", the counting/subset and
  counting/groups sources): the count of another colour (shape) present in the image, asked the same
  way (for counting/groups, the other group's count). Other
  counting records get no partner, so stages trained before this existed render as they did.
- arithmetic, only when asked (`arithmetic=True`, `vlens zoo train --arithmetic-pairs`): the same two
  colours with the other operation ("How many more red than blue" <-> "How many red and blue ... in
  total"), the larger group first for a difference; so the operation word must change the answer.
A sample with no counterpart (a lone object, every value present) has none.
"""

from __future__ import annotations

import numpy as np

from vlens.data import templates as T
from vlens.data.palette import plural
from vlens.data.styles import get_style
from vlens.utils.errors import UserInputError

BINDING_TASKS: tuple[str, ...] = ("existence", "spatial", "colour", "shape")


def _other_operation(record: dict) -> tuple[str, str]:
    """The same two colours asked with the other operation: a sum becomes a difference (larger group first)
    and a difference a sum."""
    template = str(record["template"])
    if template not in (T.SUM_OF_COLORS, T.DIFFERENCE_OF_COLORS):
        raise UserInputError(f"not an arithmetic template: {template!r}")
    colours = [o["color"] for o in record["objects"]]
    asked = list(dict.fromkeys(o["color"] for o in record["objects"] if o["id"] in record["targets"]))
    first, second = _asked_colours(record["question"], template, asked)
    k1, k2 = colours.count(first), colours.count(second)
    if template == T.DIFFERENCE_OF_COLORS:
        return T.fill(T.SUM_OF_COLORS, color=first, color2=second), str(k1 + k2)
    if k2 > k1:
        first, second, k1, k2 = second, first, k2, k1
    return T.fill(T.DIFFERENCE_OF_COLORS, color=first, color2=second), str(k1 - k2)


def _asked_colours(question: str, template: str, asked: list[str]) -> tuple[str, str]:
    """The question's two colours in the order it names them."""
    for a in asked:
        for b in asked:
            if a != b and T.fill(template, color=a, color2=b) == question:
                return a, b
    raise UserInputError(f"the colours of {question!r} are not among the asked objects' {asked}")


def _unique(objects: list[dict], key: str, exclude: str | None) -> list[dict]:
    """Objects whose `key` value occurs once in the image and differs from `exclude`."""
    values = [o[key] for o in objects]
    return [o for o in objects if values.count(o[key]) == 1 and o[key] != exclude]


def counterpart(record: dict, rng: np.random.Generator, arithmetic: bool = False) -> tuple[str, str] | None:
    """(question, answer) of the minimal-pair partner of a binding sample (and, with `arithmetic`, of an
    arithmetic one), or None."""
    task, template, objects = record.get("task"), str(record.get("template") or ""), record.get("objects", [])
    if task == "arithmetic":
        return _other_operation(record) if arithmetic else None
    if task == "existence":
        key = "shape" if template == T.EXISTS_SHAPE else "color"
        style = get_style(record["style"])
        pool = list(style.shapes if key == "shape" else style.colors)
        present = sorted({o[key] for o in objects if o.get(key)})
        if record["answer"] == T.YES:
            choices, answer = [v for v in pool if v not in present], T.NO
        else:
            choices, answer = present, T.YES
        if not choices:
            return None
        value = choices[int(rng.integers(len(choices)))]
        return T.fill(template, shape=value, color=value), answer
    if task == "spatial":
        # the asked order (the record's target ids are sorted): the pair whose question it is
        for a in objects:
            for b in objects:
                ask = {"color": a["color"], "shape": a["shape"], "color2": b["color"], "shape2": b["shape"]}
                if a is not b and T.fill(template, **ask) == record["question"]:
                    swapped = T.fill(template, color=b["color"], shape=b["shape"],
                                     color2=a["color"], shape2=a["shape"])
                    return swapped, T.NO if record["answer"] == T.YES else T.YES
        return None
    if task == "counting" and record.get("distractors") and template in (T.COUNT_COLOR, T.COUNT_SHAPE):
        key = "color" if template == T.COUNT_COLOR else "shape"
        values = [o[key] for o in objects]
        counted = {o[key] for o in objects if o["id"] in record["targets"]}
        present = sorted(set(values) - counted)
        if not present:
            return None
        value = present[int(rng.integers(len(present)))]
        return T.fill(template, color=value, shape_plural=plural(value)), str(values.count(value))
    if task in ("colour", "shape"):
        key, asked = ("shape", "color") if task == "colour" else ("color", "shape")
        target = next(o for o in objects if o["id"] == record["targets"][0])
        others = [o for o in _unique(objects, key, target[key]) if o.get(asked)]
        if not others:
            return None
        other = others[int(rng.integers(len(others)))]
        return T.fill(template, shape=other["shape"], color=other["color"]), other[asked]
    return None

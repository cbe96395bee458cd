"""Question templates of the task suites. Their exact wording is part of the API:
the embedded model is trained on them, and its tokenizer is built from
:func:`all_template_words`.

Placeholders: {color}, {color2} (palette names), {shape}, {shape2} (shape names),
{shape_plural}. Every answer is one lowercase word or a non-negative integer in digits.
Spatial words follow the viewer: "left of" means a smaller x centre, "above" a smaller y.
"""

from __future__ import annotations

import re

from vlens.data.palette import COLOR_PALETTE, REAL_SHAPES, SHAPES, plural
from vlens.utils.errors import UserInputError

TASKS: tuple[str, ...] = ("counting", "colour", "shape", "spatial", "arithmetic", "existence")

COUNT_DOTS = "How many dots are there?"
COUNT_OBJECTS = "How many objects are there?"
COUNT_COLOR = "How many {color} objects are there?"
COUNT_SHAPE = "How many {shape_plural} are there?"
COLOUR_OF_SHAPE = "What colour is the {shape}?"
SHAPE_OF_COLOR = "What shape is the {color} object?"
LEFT_OF = "Is the {color} {shape} left of the {color2} {shape2}?"
ABOVE = "Is the {color} {shape} above the {color2} {shape2}?"
SUM_OF_COLORS = "How many {color} and {color2} objects are there in total?"
DIFFERENCE_OF_COLORS = "How many more {color} than {color2} objects are there?"
EXISTS_SHAPE = "Is there a {shape}?"
EXISTS_COLOR = "Is there a {color} object?"

TEMPLATES: dict[str, tuple[str, ...]] = {
    "counting": (COUNT_DOTS, COUNT_OBJECTS, COUNT_COLOR, COUNT_SHAPE),
    "colour": (COLOUR_OF_SHAPE,),
    "shape": (SHAPE_OF_COLOR,),
    "spatial": (LEFT_OF, ABOVE),
    "arithmetic": (SUM_OF_COLORS, DIFFERENCE_OF_COLORS),
    "existence": (EXISTS_SHAPE, EXISTS_COLOR),
}

YES, NO = "yes", "no"
PUNCTUATION: tuple[str, ...] = ("?",)
DEFAULT_MAX_COUNT = 10


def template_words(template: str) -> list[str]:
    """Lowercase words of a template, placeholders and punctuation removed."""
    return re.findall(r"[a-z]+", re.sub(r"\{\w+\}", " ", template).lower())


def all_template_words(max_count: int = DEFAULT_MAX_COUNT) -> set[str]:
    """Every word that can appear in a question or an answer.

    Template words, colour names, shape names and plurals of all styles, "yes"/"no"
    and the numbers 0..max_count in digits. Questions also contain the
    :data:`PUNCTUATION` marks. Words are lowercase; questions start with a capital.
    """
    words = {w for templates in TEMPLATES.values() for t in templates for w in template_words(t)}
    shapes = set(SHAPES) | set(REAL_SHAPES) | {"circle"}
    words |= set(COLOR_PALETTE) | shapes | {plural(s) for s in shapes} | {YES, NO}
    words |= {str(i) for i in range(max_count + 1)}
    return words


def fill(template: str, **values: str) -> str:
    """The question for a template, with a clear error on a missing placeholder."""
    try:
        return template.format(**values)
    except KeyError as missing:
        raise UserInputError(f"template {template!r} needs a value for {missing}") from None

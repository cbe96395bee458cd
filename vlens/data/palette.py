"""Named colours and shape vocabularies shared by the generators and the task templates.

Every name here is a single lowercase word: the embedded model's tokenizer is built from
these lists (see :func:`vlens.data.templates.all_template_words`).
"""

from __future__ import annotations

from vlens.utils.errors import UserInputError

# name -> RGB. Distinct hues a person names without hesitation; "black" is the SynDot colour.
COLOR_PALETTE: dict[str, tuple[int, int, int]] = {
    "red": (220, 30, 30),
    "orange": (245, 130, 20),
    "yellow": (235, 200, 0),
    "green": (30, 150, 50),
    "blue": (30, 70, 220),
    "purple": (130, 40, 170),
    "black": (0, 0, 0),
}

OBJECT_COLORS: tuple[str, ...] = tuple(c for c in COLOR_PALETTE if c != "black")
"""Colours of SynPoly and SynReal-lite objects (black is kept for SynDot)."""

# SynPoly shapes (regular polygons, a five-pointed star and the circle).
SHAPES: tuple[str, ...] = ("triangle", "square", "pentagon", "hexagon", "star", "circle")

# SynReal-lite shapes: a shaded sphere ("ball") and silhouettes of everyday objects.
# All start with a consonant so "Is there a {shape}?" stays grammatical.
REAL_SHAPES: tuple[str, ...] = ("ball", "pear", "cup", "house", "tree", "fish")

_IRREGULAR_PLURALS = {"fish": "fish"}


def plural(shape: str) -> str:
    """English plural of a shape name ("star" -> "stars", "fish" -> "fish")."""
    return _IRREGULAR_PLURALS.get(shape, shape + "s")


def color_rgb(name: str) -> tuple[int, int, int]:
    """RGB of a palette colour, with a clear error for unknown names."""
    try:
        return COLOR_PALETTE[name]
    except KeyError:
        raise UserInputError(f"unknown colour {name!r}; choose one of {sorted(COLOR_PALETTE)}") from None

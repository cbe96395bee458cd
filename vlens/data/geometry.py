"""Shape outlines in unit coordinates: every shape fits in the disc of radius 1 at (0, 0).

Coordinates are (u, v) with v pointing down, like image rows. A primitive is one of
``("polygon", [(u, v), ...])``, ``("ellipse", (u0, v0, u1, v1))`` or
``("ring", (u0, v0, u1, v1, width))`` (an ellipse outline; width in unit lengths).
"""

from __future__ import annotations

import math
from typing import Any

from vlens.utils.errors import UserInputError

Primitive = tuple[str, Any]  # (kind, geometry): kind decides the geometry's shape

_POLYGON_SIDES = {"triangle": 3, "square": 4, "pentagon": 5, "hexagon": 6}
STAR_INNER_RADIUS = 0.45


def regular_polygon(n_sides: int, rotation_deg: float) -> list[tuple[float, float]]:
    """Vertices of a regular polygon inscribed in the unit circle, first vertex up."""
    start = math.radians(rotation_deg) - math.pi / 2
    return [
        (math.cos(start + 2 * math.pi * k / n_sides), math.sin(start + 2 * math.pi * k / n_sides))
        for k in range(n_sides)
    ]


def star(rotation_deg: float, points: int = 5) -> list[tuple[float, float]]:
    """Vertices of a star: outer points on the unit circle, inner ones at 0.45."""
    start = math.radians(rotation_deg) - math.pi / 2
    return [
        (
            (1.0 if k % 2 == 0 else STAR_INNER_RADIUS) * math.cos(start + math.pi * k / points),
            (1.0 if k % 2 == 0 else STAR_INNER_RADIUS) * math.sin(start + math.pi * k / points),
        )
        for k in range(2 * points)
    ]


def polygon_shape(shape: str, rotation_deg: float) -> list[Primitive]:
    """Primitives of a SynPoly shape (see :data:`vlens.data.palette.SHAPES`)."""
    if shape == "circle":
        return [("ellipse", (-1.0, -1.0, 1.0, 1.0))]
    if shape == "star":
        return [("polygon", star(rotation_deg))]
    if shape in _POLYGON_SIDES:
        return [("polygon", regular_polygon(_POLYGON_SIDES[shape], rotation_deg))]
    raise UserInputError(
        f"unknown SynPoly shape {shape!r}; choose one of {sorted(_POLYGON_SIDES) + ['circle', 'star']}"
    )


# Upright silhouettes of everyday objects for SynReal-lite ("ball" is drawn shaded instead).
_SILHOUETTES: dict[str, list[Primitive]] = {
    "pear": [
        ("ellipse", (-0.75, -0.15, 0.75, 0.9)),
        ("ellipse", (-0.45, -0.7, 0.45, 0.3)),
        ("polygon", [(-0.05, -0.95), (0.07, -0.95), (0.05, -0.6), (-0.05, -0.6)]),
    ],
    "cup": [
        ("polygon", [(-0.6, -0.6), (0.4, -0.6), (0.3, 0.7), (-0.5, 0.7)]),
        ("ring", (0.15, -0.35, 0.85, 0.35, 0.16)),
    ],
    "house": [
        ("polygon", [(-0.6, -0.1), (0.6, -0.1), (0.6, 0.75), (-0.6, 0.75)]),
        ("polygon", [(-0.78, -0.05), (0.0, -0.8), (0.78, -0.05)]),
    ],
    "tree": [
        ("polygon", [(-0.13, 0.35), (0.13, 0.35), (0.13, 0.95), (-0.13, 0.95)]),
        ("polygon", [(-0.68, 0.45), (0.0, -0.95), (0.68, 0.45)]),
    ],
    "fish": [
        ("ellipse", (-0.8, -0.42, 0.4, 0.42)),
        ("polygon", [(0.25, 0.0), (0.88, -0.45), (0.88, 0.45)]),
    ],
}


def silhouette(shape: str, mirror: bool) -> list[Primitive]:
    """Primitives of a SynReal-lite silhouette, optionally mirrored left-right."""
    if shape not in _SILHOUETTES:
        raise UserInputError(f"unknown silhouette {shape!r}; choose one of {sorted(_SILHOUETTES)}")
    if not mirror:
        return _SILHOUETTES[shape]
    flipped: list[Primitive] = []
    for kind, geom in _SILHOUETTES[shape]:
        if kind == "polygon":
            flipped.append((kind, [(-u, v) for u, v in geom]))
        else:
            u0, v0, u1, v1, *rest = geom
            flipped.append((kind, (-u1, v0, -u0, v1, *rest)))
    return flipped

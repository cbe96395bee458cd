"""Random non-overlapping placement of round footprints inside a square image.

Every object occupies a disc (its circumscribed circle, radius ``size``). Two objects are
kept at least ``min_gap`` pixels apart edge to edge, so no pixel is touched by two objects
(antialiased edges included): that is what lets a controlled pair change some objects and
leave every other object pixel-identical.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from vlens.utils.errors import UserInputError

# Bounded effort: (restarts x objects x candidates) distance checks at most, then an error.
MAX_RESTARTS = 40
CANDIDATES_PER_OBJECT = 256


class LayoutError(UserInputError):
    """The requested objects cannot be placed (impossible or too crowded)."""


def border_margin(min_gap: float) -> float:
    """Distance kept between any object and the image border, in pixels."""
    return max(1.0, min_gap / 2)


def check_feasible(sizes: Sequence[float], image_size: int, min_gap: float) -> None:
    """Raise :class:`LayoutError` at once for requests no layout can satisfy.

    Necessary conditions only: each object fits alone, and the discs of radius
    ``size + min_gap/2`` (pairwise disjoint in any valid layout) fit in the area they
    can reach.
    """
    if min_gap < 2:
        raise LayoutError(
            f"min_gap={min_gap} is below 2 px: antialiased edges of neighbours could touch "
            "the same pixel, breaking pixel-identical pairs. Use min_gap >= 2."
        )
    margin = border_margin(min_gap)
    for s in sizes:
        if 2 * (s + margin) > image_size:
            raise LayoutError(
                f"an object of radius {s:.1f} px does not fit in a {image_size} px image "
                f"(needs {2 * (s + margin):.0f} px); use a smaller radius or a larger --size."
            )
    reach = image_size - 2 * margin + min_gap
    needed = float(np.sum(np.pi * (np.asarray(sizes) + min_gap / 2) ** 2))
    if needed > reach * reach:
        raise LayoutError(
            f"{len(sizes)} objects of radius {min(sizes):.1f}-{max(sizes):.1f} px with a gap of "
            f"{min_gap:.1f} px need at least {needed:.0f} px^2 but a {image_size} px image offers "
            f"{reach * reach:.0f}; ask for fewer objects, a smaller radius or a larger image."
        )


def place_objects(
    rng: np.random.Generator,
    sizes: Sequence[float],
    image_size: int,
    min_gap: float,
    fixed: Sequence[tuple[Sequence[float], float]] = (),
) -> np.ndarray:
    """Centres for objects of the given radii, avoiding each other and ``fixed`` objects.

    Args:
        rng: source of randomness (the only one used, so the result is deterministic).
        sizes: radius of each object's footprint, pixels.
        image_size: side of the square image, pixels.
        min_gap: smallest edge-to-edge distance between two objects, pixels (>= 2).
        fixed: already placed objects ``(center, size)`` to keep clear of.

    Returns:
        float array [n_objects, 2] of (x, y) centres, rounded to 1/100 px, in the order
        of ``sizes``.

    Raises:
        LayoutError: impossible request, or no layout found within the bounded effort.
    """
    radii = np.asarray(sizes, dtype=np.float64)
    n = len(radii)
    if n == 0:
        return np.zeros((0, 2))
    check_feasible(list(radii) + [s for _, s in fixed], image_size, min_gap)
    margin = border_margin(min_gap)
    fixed_centres = np.array([c for c, _ in fixed], dtype=np.float64).reshape(-1, 2)
    fixed_sizes = np.array([s for _, s in fixed], dtype=np.float64)
    order = np.argsort(-radii, kind="stable")  # big first: far fewer dead ends
    for _ in range(MAX_RESTARTS):
        centres = np.zeros((n, 2))
        placed_c, placed_s = fixed_centres, fixed_sizes
        for i in order:
            s = radii[i]
            lo, hi = margin + s, image_size - margin - s
            cand = np.round(rng.uniform(lo, hi, size=(CANDIDATES_PER_OBJECT, 2)), 2)
            if len(placed_s):
                dist = np.linalg.norm(cand[:, None, :] - placed_c[None, :, :], axis=-1)
                ok = np.all(dist >= s + placed_s[None, :] + min_gap, axis=1)
                if not ok.any():
                    break
                cand = cand[np.argmax(ok)]
            else:
                cand = cand[0]
            centres[i] = cand
            placed_c = np.vstack([placed_c, cand[None]])
            placed_s = np.append(placed_s, s)
        else:
            return centres
    raise LayoutError(
        f"could not place {n} objects of radius {radii.min():.1f}-{radii.max():.1f} px with a gap of "
        f"{min_gap:.1f} px in a {image_size} px image after {MAX_RESTARTS} attempts; the request "
        "is too crowded: use fewer objects, a smaller radius or gap, or a larger image."
    )

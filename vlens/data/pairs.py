"""Controlled image pairs for activation patching.

Both images come from one layout on one background. A "count" pair adds or removes
objects; the controls keep the count and either move objects ("move") or recolour them
("colour"). Every object not listed in ``changed`` is pixel-identical in both images.
"""

from __future__ import annotations

from dataclasses import dataclass

from PIL import Image

from vlens.data.layout import place_objects
from vlens.data.palette import OBJECT_COLORS
from vlens.data.scene import (
    LAYOUT_STREAM,
    PAIR_STREAM,
    Radius,
    check_count,
    check_image_size,
    check_seed,
    counting_question,
    render_with_record,
    resolve_background,
    resolve_geometry,
    sample_objects,
    stream,
)
from vlens.data.styles import get_style
from vlens.utils.errors import UserInputError

PAIR_KINDS: tuple[str, ...] = ("count", "move", "colour")


@dataclass(frozen=True)
class Pair:
    """A clean/corrupt pair. ``changed``: ids of the objects that differ (object "id" field)."""

    clean_image: Image.Image
    corrupt_image: Image.Image
    clean_record: dict
    corrupt_record: dict
    pair_id: str
    changed: list[int]
    kind: str

    def samples(self) -> list[tuple[Image.Image, dict]]:
        """[(clean image, record), (corrupt image, record)], ready for write_imagefolder."""
        return [(self.clean_image, self.clean_record), (self.corrupt_image, self.corrupt_record)]


def _check_kind_counts(kind: str, n_clean: int, n_corrupt: int | None) -> int:
    if kind not in PAIR_KINDS:
        raise UserInputError(f"unknown pair kind {kind!r}; choose one of {PAIR_KINDS}")
    if kind == "count":
        if n_corrupt is None or n_corrupt == n_clean:
            raise UserInputError(f"a 'count' pair needs n_corrupt != n_clean (got {n_clean} and {n_corrupt})")
        return n_corrupt
    if n_corrupt is not None and n_corrupt != n_clean:
        raise UserInputError(f"a {kind!r} control pair keeps the count: pass n_corrupt=None or {n_clean}")
    return n_clean


def make_pair(
    n_clean: int,
    n_corrupt: int | None,
    seed: int,
    style: str = "syndot",
    size: int = 224,
    kind: str = "count",
    n_changed: int = 1,
    radius: Radius = None,
    min_gap: float | None = None,
    background: str | None = None,
    pair_id: str | None = None,
    allow_empty: bool = False,
) -> Pair:
    """Render a controlled pair from one layout.

    Args:
        n_clean, n_corrupt: object counts; for "count" they differ, for the controls
            n_corrupt is None or equal to n_clean.
        seed: non-negative integer; same arguments and seed -> identical pair.
        style: "syndot" (default), "synpoly" or "synreal".
        kind: "count" (add/remove objects), "move" (same count, ``n_changed`` objects
            moved to free places) or "colour" (``n_changed`` objects get another colour).
        pair_id: string stored in both records; default "{style}-{kind}-{seed}".

    Returns:
        :class:`Pair`; both records carry "pair_id", "role" ("clean"/"corrupt"),
        "pair_kind" and "changed", and each object its "id" in the shared layout.
    """
    seed, size, the_style = check_seed(seed), check_image_size(size), get_style(style)
    n_corrupt = _check_kind_counts(kind, check_count(n_clean, allow_empty), n_corrupt)
    check_count(n_corrupt, allow_empty)
    radius_px, gap = resolve_geometry(the_style, size, radius, min_gap)
    n_union = max(n_clean, n_corrupt)
    union = sample_objects(
        the_style, [(None, None)] * n_union, stream(seed, LAYOUT_STREAM), size, radius_px, gap
    )
    rng = stream(seed, PAIR_STREAM)
    n_diff = abs(n_clean - n_corrupt) if kind == "count" else n_changed
    if not 1 <= n_diff <= n_union:
        raise UserInputError(f"cannot change {n_diff} of {n_union} objects; use 1 <= n_changed <= n_clean")
    changed = sorted(int(i) for i in rng.choice(n_union, size=n_diff, replace=False))

    clean, corrupt = list(union), list(union)
    if kind == "count":
        smaller = [o for o in union if o["id"] not in changed]
        clean, corrupt = (smaller, union) if n_clean < n_corrupt else (union, smaller)
    elif kind == "move":
        moved = [o for o in union if o["id"] in changed]
        # avoid every object's old place, the moved ones' included, so they really move
        centres = place_objects(
            rng, [o["size"] for o in moved], size, gap, fixed=[(o["center"], o["size"]) for o in union]
        )
        new_centre = {o["id"]: [float(x), float(y)] for o, (x, y) in zip(moved, centres, strict=True)}
        corrupt = [{**o, "center": new_centre[o["id"]]} if o["id"] in new_centre else o for o in union]
    else:

        def recolor(obj: dict) -> dict:
            pool = [
                c
                for c in (the_style.colors if len(the_style.colors) > 1 else OBJECT_COLORS)
                if c != obj["color"]
            ]
            return the_style.recolor(obj, pool[int(rng.integers(len(pool)))])

        corrupt = [recolor(o) if o["id"] in changed else o for o in union]

    background = resolve_background(the_style, background, seed)
    pair_id = pair_id if pair_id is not None else f"{style}-{kind}-{seed}"
    question = counting_question(the_style)
    rendered = []
    for role, objects in (("clean", clean), ("corrupt", corrupt)):
        image, record = render_with_record(
            the_style,
            objects,
            size,
            background,
            seed,
            question=question,
            answer=str(len(objects)),
            task="counting",
            template=question,
        )
        record.update(pair_id=pair_id, role=role, pair_kind=kind, changed=changed)
        rendered.append((image, record))
    (clean_image, clean_record), (corrupt_image, corrupt_record) = rendered
    return Pair(clean_image, corrupt_image, clean_record, corrupt_record, pair_id, changed, kind)

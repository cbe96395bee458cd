"""Reading one row's fields: required fields, whole numbers, image values, object centres.

Every helper raises a :class:`DatasetError` that names the row (``where``) and says what was
expected, never a bare KeyError / TypeError.
"""

from __future__ import annotations

from pathlib import Path

from vlens.datasets.files import resolve_inside
from vlens.datasets.records import (
    DatasetError,
    ImageObjects,
    ImageSource,
    MissingImageError,
    check_regular_file,
)

# Bulky fields are not copied into Record.extra
BULKY_FIELDS = {"points", "objects", "image", "images", "centres"}


def require(row: dict, fields: tuple[str, ...], where: str, format_name: str) -> None:
    missing = [f for f in fields if f not in row or row[f] is None]
    if missing:
        raise DatasetError(
            f"{where} lacks {missing}; {format_name} rows need the fields {list(fields)} "
            f"(it has {sorted(row)})"
        )


def as_int(value, field_name: str, where: str) -> int:
    if isinstance(value, bool):
        raise DatasetError(f"{where}: {field_name} must be a whole number, got {value!r}")
    try:
        as_float = float(value)
    except (TypeError, ValueError, OverflowError):
        as_float = float("nan")
    if as_float != as_float or abs(as_float) == float("inf") or as_float != int(as_float):
        raise DatasetError(f"{where}: {field_name} must be a whole number, got {value!r}")
    return int(as_float)


def as_text(value, field_name: str, where: str) -> str:
    """A text field: strings, numbers (as text); anything else is an error."""
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise DatasetError(f"{where}: {field_name} must be text, got {type(value).__name__} {value!r:.60}")
    return str(value)


def extra_fields(row: dict, used: set[str]) -> dict:
    return {k: v for k, v in row.items() if k not in used and k not in BULKY_FIELDS and not isinstance(v, bytes)}


def resolve_image(value, base_dir: Path, where: str, allow_absolute: bool = True) -> ImageSource:
    """A row's image value (path string or ``{"bytes", "path"}`` dict) -> an ImageSource.

    Paths must lie inside ``base_dir`` (no ``..``, no symbolic links out) and be regular files.
    """
    if isinstance(value, dict):
        if value.get("bytes"):
            return bytes(value["bytes"])
        value = value.get("path")
    if not isinstance(value, str) or not value:
        raise DatasetError(f"{where}: image must be a file path or a {{'bytes', 'path'}} dict, got {value!r:.80}")
    path = resolve_inside(base_dir, value, where, allow_absolute=allow_absolute)
    try:
        check_regular_file(path, max_bytes=None)
    except MissingImageError:
        raise MissingImageError(f"{where}: image file {path} does not exist") from None
    return path


def answer_target(answer: str) -> int | str:
    """The scored target of a free-form answer: an int for a whole number, else the text."""
    text = answer.strip()
    return int(text) if text.isdigit() else text


def row_count(row: dict, answer: str, where: str) -> int | None:
    """The row's ``count`` (None when absent), checked against the rest of the row, so that a count and an
    answer that disagree are refused naming the row (before, one of the two was silently scored):

    - a row that lists its ``objects`` (vlens data): the count is how many there are;
    - a counting row (``task`` "counting", or no task and a whole-number answer): the answer is how many
      objects the question is about, its ``targets`` when the row lists them (vlens data: a count of
      one shape among others), else the count.
    """
    if row.get("count") is None:
        return None
    count = as_int(row["count"], "count", where)
    objects, targets, task = row.get("objects"), row.get("targets"), row.get("task")
    if isinstance(objects, list) and objects and count != len(objects):
        raise DatasetError(f"{where}: the count {count} and the {len(objects)} objects the row lists disagree: fix "
                           "the count (the number of objects in the image) or the objects")
    text = answer.strip()
    if task == "counting" or (task is None and text.isdigit()):
        expected, of = ((len(targets), f"its {len(targets)} targets") if isinstance(targets, list)
                        else (count, f"its count {count}"))
        if not text.isdigit() or int(text) != expected:
            why = "'task' counting" if task == "counting" else "no 'task' and a whole-number answer"
            raise DatasetError(f"{where}: the answer {answer!r} disagrees with {of} (the row has {why}, so its answer "
                               "is that number): fix one of them, or give the row its 'task' when the count is of "
                               "something else than the answer")
    return count


def row_objects(row: dict, n_images: int, where: str) -> list[ImageObjects] | None:
    """Object centres of a one-image row, when the row has them, else None.

    Reads ``objects`` (dicts with ``center`` [x, y] in pixels; only those whose ``id`` is in
    ``targets`` when the row lists targets: the objects the question is about) or ``centres``
    ([[x, y], ...]). The image size is the row's ``image_size`` (square side, vlens data) or
    ``width`` / ``height``; without one it is left None and filled from the opened image.
    """
    objects, centres = row.get("objects"), row.get("centres")
    if objects and not centres and isinstance(objects, list) and all(
            isinstance(o, dict) and "bbox" in o and "center" not in o for o in objects):
        objects = None  # objects with boxes only (COCO-style): no centres (`row_boxes` reads the boxes)
    if not objects and not centres:
        return None
    if n_images != 1:
        raise DatasetError(f"{where}: object centres are only read for one-image rows ({n_images} images)")
    try:
        if objects:
            targets = row.get("targets")
            if targets is not None:
                wanted = set(targets)
                objects = [o for o in objects if o.get("id") in wanted]
            points = [(float(o["center"][0]), float(o["center"][1])) for o in objects]
        else:
            assert centres is not None  # one of the two is given (checked above)
            points = [(float(c[0]), float(c[1])) for c in centres]
    except (KeyError, TypeError, IndexError, ValueError, AttributeError):
        raise DatasetError(
            f"{where}: objects must be [{{'center': [x, y]}}, ...] and centres [[x, y], ...] in pixels"
        ) from None
    return [(points, row_image_size(row, where))]


def row_image_size(row: dict, where: str) -> tuple[int, int] | None:
    """The (width, height) a row gives its image: ``image_size`` (square side, vlens data) or ``width`` /
    ``height``; None without them."""
    if row.get("image_size") is not None:
        side = as_int(row["image_size"], "image_size", where)
        return (side, side)
    if row.get("width") is not None and row.get("height") is not None:
        return (as_int(row["width"], "width", where), as_int(row["height"], "height", where))
    return None


def pixmo_points(value, where: str) -> list[ImageObjects] | None:
    """PixMo-Count's ``points`` (x, y in pixels, per its dataset card) as one image's centres.

    Accepts a list of ``{"x", "y"}`` dicts or HF's sequence-of-struct layout ``{"x": [...], "y": [...]}``;
    None or empty (the eval splits have no points) gives None.
    """
    if not value:
        return None
    try:
        if isinstance(value, dict):
            points = [(float(x), float(y)) for x, y in zip(value["x"], value["y"], strict=True)]
        else:
            points = [(float(p["x"]), float(p["y"])) for p in value]
    except (KeyError, TypeError, ValueError):
        raise DatasetError(f"{where}: points must be [{{'x': .., 'y': ..}}, ...] or {{'x': [..], 'y': [..]}}") \
            from None
    return [(points, None)] if points else None

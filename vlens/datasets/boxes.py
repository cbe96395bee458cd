"""Object boxes and masks carried by dataset rows, read in the format the user names (never guessed).

A row gives them as ``objects`` (dicts with ``bbox`` and optionally ``mask`` / ``segmentation``,
``label`` / ``category`` / ``name`` / ``shape``, ``id``: vlens data and COCO-style annotations) or as
``boxes`` ([[4 numbers], ...]) with optional ``labels`` and ``masks``. ``box_format`` says what the
four numbers are:

- ``xyxy``: (x0, y0, x1, y1) in pixels (vlens data, Pascal VOC); ``xywh``: (x, y, width, height) in
  pixels (COCO); ``cxcywh``: (centre x, centre y, width, height) in pixels;
- the same with ``_norm``: fractions of the image's width and height (YOLO is ``cxcywh_norm``).

Masks are COCO RLE (``{"size": [h, w], "counts": str or [runs]}``) or COCO polygons
(``[[x0, y0, x1, y1, ...], ...]`` in pixels), decoded by `vlens.utils.rle` (no pycocotools needed).
A box that is not four finite numbers, is empty, lies outside [0, 1] (normalised) or outside the
image (pixels, when the row gives the image's size) is a `DatasetError` naming the row.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from vlens.datasets.records import DatasetError
from vlens.utils.errors import UserInputError
from vlens.utils.rle import decode_mask, polygons_to_mask
from vlens.utils.validation import four_numbers

BOX_FORMATS = ("xyxy", "xywh", "cxcywh", "xyxy_norm", "xywh_norm", "cxcywh_norm")
LABEL_FIELDS = ("label", "category", "name", "shape")


@dataclass(frozen=True)
class ObjectBox:
    """One object of one image: its box (x0, y0, x1, y1), in pixels or, with `normalized`, as
    fractions of the image's width and height; optionally a label, an id and a mask as stored (COCO
    RLE dict or polygons)."""

    box: tuple[float, float, float, float]
    normalized: bool = False
    label: str | None = None
    id: int | None = None
    mask: dict | list | None = None

    def pixel_box(self, size: tuple[int, int] | None = None) -> tuple[float, float, float, float]:
        """(x0, y0, x1, y1) in pixels of an image of `size` = (width, height) (needed when normalised)."""
        if not self.normalized:
            return self.box
        if size is None:
            raise UserInputError("this box is normalised: give the image's (width, height) to get pixels")
        width, height = size
        x0, y0, x1, y1 = self.box
        return (x0 * width, y0 * height, x1 * width, y1 * height)

    def mask_array(self, size: tuple[int, int] | None = None) -> np.ndarray:
        """The object's bool [height, width] mask (an RLE's own size; polygons need `size` = (width, height))."""
        if self.mask is None:
            raise UserInputError("this object has no mask; use its box (pixel_box) instead")
        if isinstance(self.mask, dict):
            mask = decode_mask(self.mask)
            if size is not None and mask.shape != (size[1], size[0]):
                raise UserInputError(f"the object's RLE mask is {mask.shape[1]} x {mask.shape[0]} but the image is "
                                     f"{size[0]} x {size[1]}")
            return mask
        if size is None:
            raise UserInputError("a polygon mask needs the image's (width, height) to be rasterised")
        return polygons_to_mask(self.mask, size[1], size[0])


def check_box_format(box_format: str) -> str:
    if box_format not in BOX_FORMATS:
        raise DatasetError(f"unknown box_format {box_format!r}: use one of {', '.join(BOX_FORMATS)} (xywh is COCO's "
                           "[x, y, width, height]; _norm: fractions of the image's width and height)")
    return box_format


def to_xyxy(values, box_format: str, where: str, size: tuple[int, int] | None) -> tuple[float, float, float, float]:
    """Four numbers in `box_format` as a checked (x0, y0, x1, y1) (pixels, or fractions for _norm)."""
    numbers = four_numbers(values, f"{where}: box", f"give four numbers in {box_format}", DatasetError)
    a, b, c, d = numbers
    kind = box_format.removesuffix("_norm")
    if kind == "xyxy":
        box = (a, b, c, d)
    elif kind == "xywh":
        box = (a, b, a + c, b + d)
    else:
        box = (a - c / 2, b - d / 2, a + c / 2, b + d / 2)
    if not (box[0] < box[2] and box[1] < box[3]):
        raise DatasetError(f"{where}: box {numbers} ({box_format}) is empty: it needs a positive width and height")
    limit = (1.0, 1.0) if box_format.endswith("_norm") else size
    tolerance = 1e-6 if box_format.endswith("_norm") else 1e-3  # float rounding of stored values
    if box[0] < -tolerance or box[1] < -tolerance or (
            limit is not None and (box[2] > limit[0] + tolerance or box[3] > limit[1] + tolerance)):
        bounds = "[0, 1] (normalised)" if box_format.endswith("_norm") else (
            f"the {limit[0]} x {limit[1]} image" if limit is not None else "the image (negative)")
        raise DatasetError(f"{where}: box {numbers} ({box_format}) lies outside {bounds}; check box_format "
                           f"(one of {', '.join(BOX_FORMATS)})")
    return box


def _mask(value, where: str):
    if value is None:
        return None
    if isinstance(value, dict) and "size" in value and "counts" in value:
        return value
    if isinstance(value, (list, tuple)) and value and all(isinstance(p, (list, tuple)) for p in value):
        return [list(p) for p in value]
    raise DatasetError(f"{where}: a mask must be COCO RLE {{'size': [h, w], 'counts': ...}} or polygons "
                       "[[x0, y0, x1, y1, ...], ...]")


def _label(obj: dict) -> str | None:
    for name in LABEL_FIELDS:
        if obj.get(name) is not None:
            return str(obj[name])
    return None


def row_boxes(row: dict, n_images: int, where: str, box_format: str,
              size: tuple[int, int] | None = None) -> list[list[ObjectBox]] | None:
    """The object boxes of a one-image row (one list for its image), or None when it has none.

    size: the image's (width, height) when the row gives it (pixel boxes are then checked against it).
    """
    objects, boxes = row.get("objects") or [], row.get("boxes")
    has_boxes = bool(boxes) or (isinstance(objects, list) and any(isinstance(o, dict) and "bbox" in o
                                                                   for o in objects))
    if not has_boxes:
        return None
    check_box_format(box_format)
    if n_images != 1:
        raise DatasetError(f"{where}: object boxes are only read for one-image rows ({n_images} images)")
    normalized = box_format.endswith("_norm")
    out = []
    if boxes:
        labels, masks = row.get("labels") or [], row.get("masks") or []
        for k, values in enumerate(boxes):
            label = labels[k] if k < len(labels) else None
            out.append(ObjectBox(to_xyxy(values, box_format, f"{where} box {k}", size), normalized,
                                 None if label is None else str(label), k,
                                 _mask(masks[k] if k < len(masks) else None, f"{where} mask {k}")))
        return [out]
    for k, obj in enumerate(objects):
        if not isinstance(obj, dict) or "bbox" not in obj:
            raise DatasetError(f"{where}: object {k} has no 'bbox' while others do; give every object one")
        identifier = obj.get("id")
        out.append(ObjectBox(to_xyxy(obj["bbox"], box_format, f"{where} object {k}", size), normalized, _label(obj),
                             int(identifier) if isinstance(identifier, (int, float)) else k,
                             _mask(obj.get("mask", obj.get("segmentation")), f"{where} object {k} mask")))
    return [out]

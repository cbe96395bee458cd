"""Binary masks as COCO run-length encodings, written here so that no dependency is needed (pycocotools
reads and writes the same bytes).

COCO's RLE runs over the mask in column-major (Fortran) order, starting with a run of zeros (possibly
empty): ``{"size": [height, width], "counts": [z0, o0, z1, o1, ...]}``. The compressed form keeps
``counts`` as a string: each count (from the fourth on, minus the count two before it) in 5-bit
groups, low bits first, each group + 48 as one ASCII character, 0x20 marking "more groups follow" and
0x10 the sign of the last group (pycocotools' ``rleToString`` / ``rleFrString``). Polygons
(``[[x0, y0, x1, y1, ...], ...]`` in pixels) are rasterised with pycocotools' own algorithm
(``rleFrPoly``), so a COCO annotation gives the same mask either way.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from vlens.utils.errors import UserInputError


def rle_counts(mask: np.ndarray) -> list[int]:
    """The run lengths of a bool [height, width] mask, column-major, starting with zeros."""
    flat = np.asarray(mask, dtype=bool).flatten(order="F")
    if flat.size == 0:
        return []
    changes = np.flatnonzero(flat[1:] != flat[:-1]) + 1
    edges = np.concatenate([[0], changes, [flat.size]])
    runs = np.diff(edges).tolist()
    return [0, *runs] if flat[0] else runs


def counts_to_string(counts: Sequence[int]) -> str:
    """COCO's compressed string of run lengths (pycocotools' ``rleToString``)."""
    out = []
    for i, count in enumerate(counts):
        x = int(count) - (int(counts[i - 2]) if i > 2 else 0)
        more = True
        while more:
            c = x & 0x1F
            x >>= 5
            more = (x != -1) if (c & 0x10) else (x != 0)
            if more:
                c |= 0x20
            out.append(chr(c + 48))
    return "".join(out)


def string_to_counts(text: str) -> list[int]:
    """The run lengths of COCO's compressed string (pycocotools' ``rleFrString``)."""
    counts: list[int] = []
    p = 0
    while p < len(text):
        x = k = 0
        more = True
        while more:
            if p >= len(text):
                raise UserInputError("the RLE string ends inside a count: it is truncated or not COCO's encoding")
            c = ord(text[p]) - 48
            if not 0 <= c < 64:
                raise UserInputError(f"the RLE string holds {text[p]!r}, which is not a COCO RLE character")
            x |= (c & 0x1F) << (5 * k)
            more = bool(c & 0x20)
            p += 1
            k += 1
            if not more and (c & 0x10):
                x |= -1 << (5 * k)
        if len(counts) > 2:
            x += counts[-2]
        counts.append(x)
    return counts


def encode_mask(mask: np.ndarray) -> dict:
    """A bool [height, width] mask as COCO's compressed RLE ``{"size": [h, w], "counts": str}``."""
    mask = np.asarray(mask, dtype=bool)
    if mask.ndim != 2:
        raise UserInputError(f"a mask is [height, width], got shape {mask.shape}")
    return {"size": [int(mask.shape[0]), int(mask.shape[1])], "counts": counts_to_string(rle_counts(mask))}


def decode_mask(rle: dict) -> np.ndarray:
    """The bool [height, width] mask of a COCO RLE (compressed string or uncompressed list counts)."""
    try:
        height, width = (int(v) for v in rle["size"])
        counts = rle["counts"]
    except (KeyError, TypeError, ValueError):
        raise UserInputError(f"an RLE mask is {{'size': [height, width], 'counts': ...}}, got {rle!r}") from None
    if isinstance(counts, bytes):
        counts = counts.decode("ascii")
    runs = string_to_counts(counts) if isinstance(counts, str) else [int(c) for c in counts]
    if any(r < 0 for r in runs) or sum(runs) != height * width:
        raise UserInputError(f"the RLE's runs add up to {sum(runs)} pixels (or hold a negative run) but its size "
                             f"{height} x {width} has {height * width}")
    values = np.zeros(len(runs), dtype=bool)
    values[1::2] = True
    flat = np.repeat(values, runs)
    return flat.reshape((height, width), order="F")


def polygon_counts(xy: Sequence[float], height: int, width: int) -> list[int]:
    """The RLE runs of one polygon, rasterised as pycocotools' ``rleFrPoly`` does (the boundary traced at
    5x resolution, one run boundary where it crosses each pixel column's centre), so COCO polygon
    annotations give the same masks as with pycocotools."""
    scale = 5.0
    k = len(xy) // 2
    x = [int(scale * xy[2 * j] + 0.5) for j in range(k)] + [0]
    y = [int(scale * xy[2 * j + 1] + 0.5) for j in range(k)] + [0]
    x[k], y[k] = x[0], y[0]
    u: list[int] = []
    v: list[int] = []
    for j in range(k):  # every 5x-resolution point along the boundary
        xs, xe, ys, ye = x[j], x[j + 1], y[j], y[j + 1]
        dx, dy = abs(xe - xs), abs(ys - ye)
        flip = (dx >= dy and xs > xe) or (dx < dy and ys > ye)
        if flip:
            xs, xe, ys, ye = xe, xs, ye, ys
        if dx >= dy:
            slope = (ye - ys) / dx if dx else 0.0
            for d in range(dx + 1):
                t = dx - d if flip else d
                u.append(t + xs)
                v.append(int(ys + slope * t + 0.5))
        else:
            slope = (xe - xs) / dy
            for d in range(dy + 1):
                t = dy - d if flip else d
                v.append(t + ys)
                u.append(int(xs + slope * t + 0.5))
    starts: list[int] = []
    for j in range(1, len(u)):  # where the boundary crosses a pixel column's centre: a run boundary
        if u[j] == u[j - 1]:
            continue
        xd = (float(u[j] if u[j] < u[j - 1] else u[j] - 1) + 0.5) / scale - 0.5
        if math.floor(xd) != xd or xd < 0 or xd > width - 1:
            continue
        yd = (float(v[j] if v[j] < v[j - 1] else v[j - 1]) + 0.5) / scale - 0.5
        yd = math.ceil(min(max(yd, 0.0), float(height)))
        starts.append(int(xd) * height + int(yd))
    starts.append(height * width)
    starts.sort()
    deltas, previous = [], 0
    for value in starts:
        deltas.append(value - previous)
        previous = value
    counts = [deltas[0]]
    j = 1
    while j < len(deltas):
        if deltas[j] > 0:
            counts.append(deltas[j])
            j += 1
        else:  # two crossings at one pixel cancel: merge the runs around them
            j += 1
            if j < len(deltas):
                counts[-1] += deltas[j]
                j += 1
    return counts


def polygons_to_mask(polygons: Sequence[Sequence[float]], height: int, width: int) -> np.ndarray:
    """The bool [height, width] mask of COCO polygons ``[[x0, y0, x1, y1, ...], ...]`` (pixels): their
    union, each rasterised as pycocotools does (`polygon_counts`)."""
    out = np.zeros((int(height), int(width)), dtype=bool)
    for polygon in polygons:
        values = [float(v) for v in polygon]
        if len(values) < 6 or len(values) % 2:
            raise UserInputError(f"a polygon is [x0, y0, x1, y1, x2, y2, ...] (at least 3 points), got {len(values)} "
                                 "numbers")
        if not all(math.isfinite(v) for v in values):
            raise UserInputError("a polygon holds NaN or infinity")
        out |= decode_mask({"size": [int(height), int(width)], "counts": polygon_counts(values, int(height), int(width))})
    return out

"""Image regions from geometry: which tokens of an image a pixel box, mask or point falls on.

Every family's preprocessing (resize, crop, pad, tiles, thumbnails) is an axis-aligned affine map per
view, so each image token covers one rectangle of the ORIGINAL image (`ArchitectureAdapter.token_pixel_boxes`,
possibly running past the image onto padding). `ImageGeometry` holds those rectangles for one image of a
batch (built by `model.prepare`); a box or mask then selects the tokens it overlaps, every view of the
image at once (base view, each tile, thumbnail; newline and CLS tokens are no place on the image), with
the covered fraction of each token's area:

    coverage(t) = area(region ∩ box(t) ∩ image) / area(box(t))

(a token partly on the padding is never fully covered). The one general algorithm lives here; the
per-family geometry lives in the adapters. See docs/regions.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from vlens.core.architectures.base import ImageTile
from vlens.utils.errors import UserInputError
from vlens.utils.validation import four_numbers
from vlens.viz.regions import token_selection_figure


@dataclass(frozen=True)
class ImageGeometry:
    """The pixel geometry of one image's tokens in one batch row.

    Attributes:
        row: the batch row; image: the image's index in the batch (in order of appearance).
        size: the original (width, height) in pixels.
        positions: LongTensor [m], the image's spatial tokens (positions in the row).
        boxes: [m, 4] float64 (x0, y0, x1, y1), each token's full cell in original pixels (may run
            past the image onto the processor's padding).
        labels: m names, ``img0[r2,c3]`` on the view that covers the whole image, ``img0.tile[r0,c1][r2,c3]``
            on a tile, ``img0.{kind}[r,c]`` on another view.
        view: LongTensor [m], which view each token belongs to (0: the whole-image view; 1: the tiles,
            which together form one high-resolution view; 2 + k: any other spatial record k).
        cell: LongTensor [m, 2], (row, col) of each token on its view's grid (the tiles of a split image
            share one grid, so neighbours across a tile border are neighbours).
    """

    row: int
    image: int
    size: tuple[int, int]
    positions: Tensor
    boxes: Tensor
    labels: list[str]
    view: Tensor
    cell: Tensor

    @property
    def clipped(self) -> Tensor:
        """[m, 4] the boxes clipped to the image (the part of each cell the image fills)."""
        width, height = self.size
        bounds = torch.tensor([0.0, 0.0, 0.0, 0.0], dtype=torch.float64)
        limits = torch.tensor([width, height, width, height], dtype=torch.float64)
        return torch.minimum(torch.maximum(self.boxes, bounds), limits)

    @property
    def areas(self) -> Tensor:
        """[m] each token's full cell area (padding included)."""
        return (self.boxes[:, 2] - self.boxes[:, 0]) * (self.boxes[:, 3] - self.boxes[:, 1])


def _label(image: int, record: ImageTile, same_kind: int, r: int, c: int) -> str:
    cell = f"[r{r},c{c}]"
    if record.kind in ("image", "base"):
        return f"img{image}{cell}"
    if record.kind == "tile" and record.layout is not None:
        return f"img{image}.tile[r{record.layout[0]},c{record.layout[1]}]{cell}"
    if record.kind == "frame":  # a video's frame (temporal patch)
        return f"img{image}.f{record.index}{cell}"
    return f"img{image}.{record.kind}{same_kind}{cell}"


def _grid_index(values: np.ndarray) -> np.ndarray:
    """Rank of each value among the distinct values (to a 1e-6 px tolerance): cells on one axis."""
    return np.unique(np.round(values * 1e6), return_inverse=True)[1].reshape(-1)


def build_geometry(row: int, image: int, size: tuple[int, int], records: Sequence[ImageTile],
                   boxes: Sequence[Tensor]) -> ImageGeometry:
    """The `ImageGeometry` of one image from its spatial records (positions in the row) and each
    record's token boxes ([n, 4] from `token_pixel_boxes`, row-major over the record's grid)."""
    positions, all_boxes, labels, views = [], [], [], []
    kinds_seen: dict[str, int] = {}
    for k, (record, record_boxes) in enumerate(zip(records, boxes, strict=True)):
        rows, cols = record.grid
        if record_boxes.shape != (rows * cols, 4) or len(record.positions) != rows * cols:
            raise RuntimeError(f"token boxes {tuple(record_boxes.shape)} do not fit a {rows}x{cols} {record.kind} record")
        same = kinds_seen.get(record.kind, 0)
        kinds_seen[record.kind] = same + 1
        positions.append(record.positions.cpu().long())
        all_boxes.append(record_boxes.to(torch.float64))
        labels += [_label(image, record, same, r, c) for r in range(rows) for c in range(cols)]
        view = 0 if record.kind in ("image", "base") else 1 if record.kind == "tile" else 2 + k
        views.append(torch.full((rows * cols,), view, dtype=torch.long))
    positions_t = torch.cat(positions) if positions else torch.zeros(0, dtype=torch.long)
    boxes_t = torch.cat(all_boxes) if all_boxes else torch.zeros(0, 4, dtype=torch.float64)
    view_t = torch.cat(views) if views else torch.zeros(0, dtype=torch.long)
    boxes_np, view_np = boxes_t.numpy(), view_t.numpy()
    cell = np.zeros((len(positions_t), 2), dtype=np.int64)
    for v in np.unique(view_np):  # one grid per view: rank of each cell's centre on each axis
        at = view_np == v
        cell[at, 0] = _grid_index((boxes_np[at, 1] + boxes_np[at, 3]) / 2)
        cell[at, 1] = _grid_index((boxes_np[at, 0] + boxes_np[at, 2]) / 2)
    return ImageGeometry(row, image, (int(size[0]), int(size[1])), positions_t, boxes_t, labels, view_t,
                         torch.from_numpy(cell))


@dataclass(frozen=True)
class TokenSelection:
    """Image tokens selected by a region of one image, with how much of each the region covers.

    Attributes:
        positions: LongTensor [n], the tokens' positions in the prompt (row `row`), every view of the
            image, sorted.
        coverage: float64 [n], the fraction of each token's pixel area the region covers (in (0, 1];
            1.0 for every token of `from_points` and for buffer tokens: see `buffer`).
        labels: n names (``img0[r2,c3]``, ``img0.tile[r0,c1][r2,c3]``).
        row, image: the batch row and the image's index in the batch.
        geometry: the image's `ImageGeometry` (what `buffer` and `positions_at` read).
    """

    positions: Int[Tensor, " n"]
    coverage: Float[Tensor, " n"]
    labels: list[str]
    row: int
    image: int
    geometry: ImageGeometry
    threshold: float = 0.0
    region: tuple[float, float, float, float] | None = None  # the selecting box, where there is one

    def __len__(self) -> int:
        return len(self.positions)

    def _rows(self) -> Tensor:
        """Where each selected token sits in `geometry` (its row of boxes, labels, views)."""
        order = torch.argsort(self.geometry.positions)
        return order[torch.searchsorted(self.geometry.positions[order], self.positions)]

    @property
    def boxes(self) -> Float[Tensor, "n 4"]:
        """[n, 4] each selected token's pixel box in the original image (clipped to it)."""
        return self.geometry.clipped[self._rows()]

    def plot(self, image, title: str = ""):
        """A plotly figure of the selected tokens over `image` (the original), one panel per view, each
        token's box filled with an opacity that grows with its coverage (`vlens.viz.regions`)."""
        if tuple(image.size) != self.geometry.size:
            raise UserInputError(f"the image is {image.size[0]} x {image.size[1]} but the selection was made on a "
                                 f"{self.geometry.size[0]} x {self.geometry.size[1]} image: pass the original")
        return token_selection_figure(image, self.boxes, self.coverage, self.labels, self.geometry.view[self._rows()],
                                      self.region, title)

    def positions_at(self, threshold: float) -> Int[Tensor, " k"]:
        """The positions whose coverage is above `threshold` (a stricter cut of this selection)."""
        _check_threshold(threshold)
        return self.positions[self.coverage > threshold]

    def buffer(self, width: int = 1) -> TokenSelection:
        """The object's tokens plus a buffer of neighbours, as Neo et al. (ICLR 2025) define it: every
        token within `width` cells of a selected token on the same view's grid (8-neighbourhood,
        `width` steps: Chebyshev distance <= width); the tiles of a split image form one grid, so the
        buffer crosses tile borders. Buffer tokens get coverage 0 unless the region covers them."""
        if not isinstance(width, int) or isinstance(width, bool) or width < 0:
            raise UserInputError(f"buffer width must be a whole number of cells >= 0, got {width!r}")
        geometry = self.geometry
        chosen = torch.isin(geometry.positions, self.positions)
        keep = chosen.clone()
        for view in geometry.view[chosen].unique().tolist():
            in_view = geometry.view == view
            seeds = geometry.cell[chosen & in_view]  # [s, 2]
            distance = (geometry.cell[:, None, :] - seeds[None, :, :]).abs().amax(-1).amin(-1)  # [m]
            keep |= in_view & (distance <= width)
        coverage = torch.zeros(len(geometry.positions), dtype=torch.float64)
        coverage[self._rows()] = self.coverage
        return _selection(geometry, keep, coverage, self.threshold, self.region)


def _selection(geometry: ImageGeometry, keep: Tensor, coverage: Tensor, threshold: float,
               region: tuple[float, float, float, float] | None = None) -> TokenSelection:
    order = torch.argsort(geometry.positions[keep])
    index = keep.nonzero().flatten()[order]
    return TokenSelection(geometry.positions[index], coverage[index], [geometry.labels[i] for i in index.tolist()],
                          geometry.row, geometry.image, geometry, threshold, region)


def _check_threshold(threshold: float) -> None:
    if not isinstance(threshold, (int, float)) or isinstance(threshold, bool) or not 0 <= threshold < 1:
        raise UserInputError(f"threshold must be a fraction of a token's area in [0, 1), got {threshold!r}: "
                             "tokens with coverage above it are selected (0: any overlap)")


def check_box(box, size: tuple[int, int], what: str = "box") -> tuple[float, float, float, float]:
    """A pixel box (x0, y0, x1, y1) of an image of `size` = (width, height), checked: four finite
    numbers, x0 < x1 and y0 < y1, inside the image (0 <= x0, x1 <= width, ...)."""
    width, height = size
    hint = f"give (x0, y0, x1, y1) in pixels of the original {width} x {height} image"
    values = four_numbers(box, what, hint)
    x0, y0, x1, y1 = values
    if not (x0 < x1 and y0 < y1):
        raise UserInputError(f"{what} {values} is empty (needs x0 < x1 and y0 < y1): {hint}")
    if x0 < 0 or y0 < 0 or x1 > width or y1 > height:
        raise UserInputError(f"{what} {values} lies outside the {width} x {height} image: {hint}")
    return x0, y0, x1, y1


def box_coverage(geometry: ImageGeometry, box: tuple[float, float, float, float]) -> Tensor:
    """[m] the fraction of each token's cell that `box` covers (box already checked)."""
    clipped = geometry.clipped
    x0 = torch.clamp(clipped[:, 0], min=box[0])
    y0 = torch.clamp(clipped[:, 1], min=box[1])
    x1 = torch.clamp(clipped[:, 2], max=box[2])
    y1 = torch.clamp(clipped[:, 3], max=box[3])
    overlap = (x1 - x0).clamp(min=0) * (y1 - y0).clamp(min=0)
    return overlap / geometry.areas


def mask_coverage(geometry: ImageGeometry, mask: Bool[Tensor, "H W"]) -> Tensor:
    """[m] the fraction of each token's cell that a pixel mask covers, exactly: pixel (i, j) is the
    square [j, j + 1) x [i, i + 1), and the mask's area over any rectangle is read off its summed-area
    table, which is bilinear inside each pixel (so fractional cell edges are exact)."""
    height, width = mask.shape
    table = torch.zeros(height + 1, width + 1, dtype=torch.float64)
    table[1:, 1:] = mask.to(torch.float64).cumsum(0).cumsum(1)

    def integral(x: Tensor, y: Tensor) -> Tensor:  # area of the mask in [0, x] x [0, y]
        x, y = x.clamp(0, width), y.clamp(0, height)
        j, i = x.floor().long().clamp(max=width - 1), y.floor().long().clamp(max=height - 1)
        fx, fy = x - j, y - i
        return (table[i, j] * (1 - fx) * (1 - fy) + table[i, j + 1] * fx * (1 - fy)
                + table[i + 1, j] * (1 - fx) * fy + table[i + 1, j + 1] * fx * fy)

    b = geometry.clipped
    covered = integral(b[:, 2], b[:, 3]) - integral(b[:, 0], b[:, 3]) - integral(b[:, 2], b[:, 1]) + integral(b[:, 0], b[:, 1])
    return covered.clamp(min=0) / geometry.areas


def check_mask(mask, size: tuple[int, int]) -> Tensor:
    """A bool [height, width] mask of the original image (a tensor or array of 0/1 or bools)."""
    width, height = size
    if isinstance(mask, np.ndarray):
        mask = torch.from_numpy(mask)
    if not isinstance(mask, Tensor):
        raise UserInputError(f"mask must be a bool tensor or array [height, width], got {type(mask).__name__}")
    if mask.shape != (height, width):
        raise UserInputError(f"mask has shape {tuple(mask.shape)} but the image is {width} x {height}: give a "
                             f"[{height}, {width}] mask in original pixels (rows = y)")
    if mask.dtype != torch.bool:
        if mask.is_floating_point() and not bool(torch.isfinite(mask).all()):
            raise UserInputError("mask holds NaN or infinity: give a bool [height, width] mask")
        if not bool(((mask == 0) | (mask == 1)).all()):
            raise UserInputError("mask holds values other than 0 and 1: give a bool [height, width] mask")
        mask = mask != 0
    if not bool(mask.any()):
        raise UserInputError("mask is empty (no pixel set): the region must cover some of the image")
    return mask.cpu()


def select_box(geometry: ImageGeometry, box, threshold: float = 0.0) -> TokenSelection:
    """The tokens a pixel box covers more than `threshold` of (every view of the image)."""
    _check_threshold(threshold)
    region = check_box(box, geometry.size)
    coverage = box_coverage(geometry, region)
    return _selection(geometry, coverage > threshold, coverage, threshold, region)


def select_mask(geometry: ImageGeometry, mask, threshold: float = 0.0) -> TokenSelection:
    """The tokens a pixel mask covers more than `threshold` of (every view of the image)."""
    _check_threshold(threshold)
    coverage = mask_coverage(geometry, check_mask(mask, geometry.size))
    return _selection(geometry, coverage > threshold, coverage, threshold)


def select_points(geometry: ImageGeometry, points) -> TokenSelection:
    """The tokens whose pixels hold any of `points` ((x, y) in original pixels, [n, 2]): in every view,
    the token whose cell [x0, x1) x [y0, y1) holds the point (the image's right and bottom edges count
    as inside the last cell). Coverage is 1.0 for each."""
    width, height = geometry.size
    try:
        xy = torch.as_tensor(points, dtype=torch.float64).reshape(-1, 2)
    except (TypeError, ValueError, RuntimeError):
        raise UserInputError(f"points {points!r} are not (x, y) pairs: give [[x, y], ...] in original pixels") from None
    if len(xy) == 0:
        raise UserInputError("no points given: give [[x, y], ...] in original pixels")
    if not bool(torch.isfinite(xy).all()):
        raise UserInputError(f"points {xy.tolist()} hold NaN or infinity")
    outside = (xy[:, 0] < 0) | (xy[:, 0] > width) | (xy[:, 1] < 0) | (xy[:, 1] > height)
    if bool(outside.any()):
        raise UserInputError(f"points {xy[outside].tolist()} lie outside the {width} x {height} image")
    b = geometry.clipped
    x, y = xy[:, 0][None, :], xy[:, 1][None, :]
    in_x = (b[:, 0:1] <= x) & ((x < b[:, 2:3]) | ((x == width) & (b[:, 2:3] == width)))
    in_y = (b[:, 1:2] <= y) & ((y < b[:, 3:4]) | ((y == height) & (b[:, 3:4] == height)))
    hit = (in_x & in_y & (geometry.areas[:, None] > 0)).any(-1)
    return _selection(geometry, hit, hit.to(torch.float64), 0.0)


def token_box(geometry: ImageGeometry, position: int, clip: bool = True) -> tuple[float, float, float, float]:
    """The pixel box (x0, y0, x1, y1) of the token at `position` in the original image (clipped to the
    image, or its full cell with clip=False)."""
    at = (geometry.positions == int(position)).nonzero().flatten()
    if len(at) == 0:
        raise UserInputError(f"position {position} is no spatial token of image {geometry.image} (row {geometry.row}); "
                             "its tokens are inputs.regions.images[row][image] (newline and CLS tokens have no box)")
    box = (geometry.clipped if clip else geometry.boxes)[int(at[0])]
    return tuple(float(v) for v in box.tolist())  # type: ignore[return-value]


"""Dense labels and linear heads on the vision tower's merged image tokens.

Each merged image token (what the language model reads) covers one cell of the image.
Its labels come from the object under the cell's pixels (`appearance.id_map_of` /
`appearance.redraw`): the shape and colour of the object covering most of the cell (at
least MIN_CELL_COVER of it; else background), and how many object centres fall inside the
cell (0, 1, 2, 3+; summed over the cells this is the image's count). The vision
pretraining stage trains the tower on these labels alone; language stages may keep them as
an auxiliary loss (`--vision-aux-weight`). The heads exist only during training: a saved
folder is the plain HF model.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import cast

import numpy as np
import torch
from jaxtyping import Float, Int
from torch import nn

from vlens.data.palette import COLOR_PALETTE, REAL_SHAPES, SHAPES
from vlens.utils.errors import UserInputError

IGNORE = -100
BACKGROUND = 0
MIN_CELL_COVER = 0.05  # a sliver of an object does not make a cell that object
SHAPE_CLASSES: tuple[str, ...] = ("background", *dict.fromkeys((*SHAPES, "circle")), *REAL_SHAPES)
COLOUR_CLASSES: tuple[str, ...] = ("background", *COLOR_PALETTE)
MAX_CENTRES = 3  # the centre-count class of a cell saturates here ("3 or more")
LABEL_KINDS: tuple[str, ...] = ("shape", "colour", "centres")
N_CLASSES: dict[str, int] = {
    "shape": len(SHAPE_CLASSES),
    "colour": len(COLOUR_CLASSES),
    "centres": MAX_CENTRES + 1,
}


def dense_labels(
    id_map: Int[np.ndarray, "height width"], objects: list[dict], grid: int
) -> Int[np.ndarray, "3 cells"]:
    """(shape, colour, centre count) class of each of the grid x grid cells (row-major).

    id_map: object id per pixel (-1 background), the image's own resolution (square);
    objects: the record's objects (ids index them; "shape", "color", "center" in pixels).
    """
    size = id_map.shape[0]
    if id_map.shape != (size, size):
        raise UserInputError(f"dense_labels needs a square id map, got {id_map.shape}")
    rows = (np.arange(size) * grid) // size  # the cell row (and column) of each pixel line
    cell = rows[:, None] * grid + rows[None, :]
    covered = id_map >= 0
    by_object = {obj["id"]: obj for obj in objects}
    n_ids = max(by_object, default=-1) + 1
    counts = np.zeros((grid * grid, max(n_ids, 1)), dtype=np.int64)
    np.add.at(counts, (cell[covered], id_map[covered].astype(np.int64)), 1)
    cell_area = (size / grid) ** 2
    winner = counts.argmax(axis=1)
    has_object = counts.max(axis=1) >= MIN_CELL_COVER * cell_area
    labels = np.zeros((3, grid * grid), dtype=np.int64)
    for index in np.nonzero(has_object)[0]:
        obj = by_object[int(winner[index])]
        labels[0, index] = SHAPE_CLASSES.index(obj["shape"]) if obj["shape"] in SHAPE_CLASSES else IGNORE
        labels[1, index] = COLOUR_CLASSES.index(obj["color"]) if obj["color"] in COLOUR_CLASSES else IGNORE
    labels[2] = np.minimum(centre_counts(objects, size, grid), MAX_CENTRES)
    return labels


def centre_counts(objects: list[dict], image_px: int, grid: int) -> Int[np.ndarray, " cells"]:
    """How many object centres ("center", pixels of a square image_px image) fall in each of the
    grid x grid cells (row-major), uncapped: summed over the cells it is the object count."""
    counts = np.zeros(grid * grid, dtype=np.int64)
    for obj in objects:
        x, y = obj["center"]
        column = min(grid - 1, max(0, int(x * grid // image_px)))
        row = min(grid - 1, max(0, int(y * grid // image_px)))
        counts[row * grid + column] += 1
    return counts


class VisionAuxHeads(nn.Module):
    """Linear shape, colour and centre-count classifiers on merged image tokens."""

    def __init__(self, width: int, seed: int) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(seed)
        heads = {kind: nn.Linear(width, N_CLASSES[kind]) for kind in LABEL_KINDS}
        with torch.no_grad():
            for layer in heads.values():
                layer.weight.copy_(torch.randn(layer.weight.shape, generator=generator) * width**-0.5)
                layer.bias.zero_()
        self.heads = nn.ModuleDict(heads)

    def logits(self, tokens: Float[torch.Tensor, "n_tokens width"]) -> dict[str, torch.Tensor]:
        return {kind: head(tokens) for kind, head in self.heads.items()}

    def losses(
        self, tokens: Float[torch.Tensor, "n_tokens width"], labels: Int[torch.Tensor, "3 n_tokens"]
    ) -> dict[str, torch.Tensor]:
        """Each head's mean cross-entropy over its labelled tokens (0 where none is)."""
        out = {}
        for row, (kind, head) in enumerate(self.heads.items()):
            target = labels[row]
            if (target != IGNORE).any():
                out[kind] = nn.functional.cross_entropy(head(tokens), target, ignore_index=IGNORE)
            else:
                out[kind] = tokens.new_zeros(())
        return out

    def loss(
        self, tokens: Float[torch.Tensor, "n_tokens width"], labels: Int[torch.Tensor, "3 n_tokens"]
    ) -> torch.Tensor:
        """Sum of the three heads' losses."""
        return cast(torch.Tensor, sum(self.losses(tokens, labels).values()))


@contextmanager
def captured_image_tokens(model):
    """Collects the merged image tokens [n_images * cells, width] (image order) that the HF
    Qwen2/2.5-VL vision tower returns during a forward inside the block; the hook is
    removed on exit, also on error."""
    captured: list[torch.Tensor] = []

    def keep(_module, _inputs, output):
        captured.append(output.pooler_output if hasattr(output, "pooler_output") else output)

    handle = model.model.visual.register_forward_hook(keep)
    try:
        yield captured
    finally:
        handle.remove()

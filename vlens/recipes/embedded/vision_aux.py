"""An auxiliary, dense objective on the vision tower's output (a recipe option).

Real VLMs start from a pre-trained vision encoder; the embedded model learns its tower from
the answer tokens alone, where a shape word gives one gradient signal per image and shape
features emerge very slowly. With `vision_aux_weight > 0`, each merged image token (what
the language model reads) is also classified by two linear heads, into the shape and the
colour of the object covering most of its cell (or background). The heads exist only
during training: the saved folder is the plain HF model.
"""

from __future__ import annotations

from contextlib import contextmanager

import numpy as np
import torch
from jaxtyping import Float, Int
from torch import nn

from vlens.data.palette import COLOR_PALETTE, SHAPES

IGNORE = -100
BACKGROUND = 0
MIN_CELL_COVER = 0.05  # a sliver of an object's box does not make a cell that object
SHAPE_CLASSES: tuple[str, ...] = ("background", *dict.fromkeys((*SHAPES, "circle")))
COLOUR_CLASSES: tuple[str, ...] = ("background", *COLOR_PALETTE)


def cell_labels(record: dict, grid: int) -> Int[np.ndarray, "2 cells"]:
    """(shape, colour) class of each of the grid x grid merged-token cells (row-major).

    A cell takes the object whose bounding box covers most of it (at least
    MIN_CELL_COVER of the cell), else background. Images
    without an object list (another renderer) are IGNORE everywhere; objects whose shape
    or colour is outside the class lists (SynReal-lite's real shapes) are IGNORE there.
    """
    labels = np.full((2, grid * grid), IGNORE, dtype=np.int64)
    objects, size = record.get("objects"), record.get("image_size")
    if not objects or not size:
        return labels
    labels[:] = BACKGROUND
    edges = np.linspace(0.0, float(size), grid + 1)
    best = np.full(grid * grid, MIN_CELL_COVER * (size / grid) ** 2)
    for obj in objects:
        x0, y0, x1, y1 = obj["bbox"]
        overlap_x = np.clip(np.minimum(edges[1:], x1) - np.maximum(edges[:-1], x0), 0, None)
        overlap_y = np.clip(np.minimum(edges[1:], y1) - np.maximum(edges[:-1], y0), 0, None)
        area = np.outer(overlap_y, overlap_x).reshape(-1)  # rows = y, columns = x
        wins = area > best
        best = np.where(wins, area, best)
        shape = SHAPE_CLASSES.index(obj["shape"]) if obj["shape"] in SHAPE_CLASSES else IGNORE
        colour = COLOUR_CLASSES.index(obj["color"]) if obj["color"] in COLOUR_CLASSES else IGNORE
        labels[0, wins], labels[1, wins] = shape, colour
    return labels


class VisionAuxHeads(nn.Module):
    """Linear shape and colour classifiers on merged image tokens."""

    def __init__(self, width: int, seed: int) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(seed)
        self.shape = nn.Linear(width, len(SHAPE_CLASSES))
        self.colour = nn.Linear(width, len(COLOUR_CLASSES))
        with torch.no_grad():
            for layer in (self.shape, self.colour):
                layer.weight.copy_(torch.randn(layer.weight.shape, generator=generator) * width**-0.5)
                layer.bias.zero_()

    def loss(
        self, tokens: Float[torch.Tensor, "n_tokens width"], labels: Int[torch.Tensor, "2 n_tokens"]
    ) -> torch.Tensor:
        """Sum of the two heads' mean cross-entropies over their labelled tokens (a head
        whose labels are all IGNORE adds 0)."""
        total = tokens.new_zeros(())
        for head, target in ((self.shape, labels[0]), (self.colour, labels[1])):
            if (target != IGNORE).any():
                total = total + nn.functional.cross_entropy(head(tokens), target, ignore_index=IGNORE)
        return total


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

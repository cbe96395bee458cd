"""benchmarks/bench_vision_shape.py's count probe labels, on planted records."""

from __future__ import annotations

import runpy
from pathlib import Path

import numpy as np

BENCH = runpy.run_path(str(Path(__file__).resolve().parents[2] / "benchmarks" / "bench_vision_shape.py"))


def _record(centres: list[tuple[float, float]]) -> dict:
    return {"objects": [{"id": i, "center": list(c)} for i, c in enumerate(centres)]}


def test_centres_fall_in_the_cell_of_their_pixel_and_are_not_capped():
    # 224-px image, 8 x 8 cells of 28 px: three centres in the first cell, one on each side of a border, one at the edge
    record = _record([(1, 1), (10, 20), (27.9, 27.9), (28, 0), (223.5, 223.5)])
    cells = BENCH["centres_per_cell"](record, 224, 8)
    expected = np.zeros(64, dtype=np.int64)
    expected[0], expected[1], expected[63] = 3, 1, 1
    np.testing.assert_array_equal(cells, expected)
    assert cells.sum() == len(record["objects"])  # the probe's image count is the sum over the cells


def test_the_grid_follows_the_drawn_image_size():
    # a 448-px drawing read on a 7 x 7 grid: 64 px per cell
    cells = BENCH["centres_per_cell"](_record([(63, 63), (64, 64), (447, 0)]), 448, 7)
    assert cells[0] == 1 and cells[8] == 1 and cells[6] == 1 and cells.sum() == 3

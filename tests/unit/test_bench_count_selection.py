"""benchmarks/bench_count_selection.py's choice of images and token sets, on planted records."""

from __future__ import annotations

import runpy
import sys
from pathlib import Path
from types import SimpleNamespace

import torch

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))  # the bench imports its sibling bench_arithmetic_limits
BENCH = runpy.run_path(str(BENCHMARKS / "bench_count_selection.py"))
sys.path.remove(str(BENCHMARKS))


def _record(question: str, colours: list[str]) -> dict:
    return {"question": question, "answer": "0", "objects": [{"id": i, "color": c} for i, c in enumerate(colours)]}


def test_groups_keep_images_where_another_colour_outnumbers_the_second():
    record = _record("How many more red than blue objects are there?", ["red"] * 3 + ["blue"] + ["green"] * 4)
    c2, mine, theirs = BENCH["groups"](record)
    assert c2 == "blue" and [o["id"] for o in mine] == [3] and [o["color"] for o in theirs] == ["green"] * 4
    level = _record("How many red and blue objects are there in total?", ["red", "blue", "blue"])
    assert BENCH["groups"](level) is None  # red (1) does not outnumber blue (2)
    assert BENCH["groups"](_record("How many red and blue objects are there in total?", ["blue"])) is None


def test_exclusive_tokens_drop_the_tokens_both_groups_touch():
    boxes = {(0.0, 0.0, 1.0, 1.0): [10, 11], (2.0, 2.0, 3.0, 3.0): [11, 12, 13], (4.0, 4.0, 5.0, 5.0): [15]}
    regions = SimpleNamespace(
        from_box=lambda image, box: SimpleNamespace(positions=torch.tensor(boxes[box])),
        image=[torch.arange(10, 20)],
        images=[[0]],  # one image in the row
    )
    inputs = SimpleNamespace(token_regions=regions)
    mine = [{"bbox": [0, 0, 1, 1]}]
    theirs = [{"bbox": [2, 2, 3, 3]}, {"bbox": [4, 4, 5, 5]}]
    named, other, neither = BENCH["exclusive_tokens"](inputs, 0, mine, theirs)
    assert named.tolist() == [10] and other.tolist() == [12, 13, 15]
    assert neither.tolist() == [14, 16, 17, 18, 19]
    assert BENCH["number"](" 7") == 7 and BENCH["number"]("red") is None

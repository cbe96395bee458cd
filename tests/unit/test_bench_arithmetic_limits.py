"""benchmarks/bench_arithmetic_limits.py's tabulation on planted answers (the numbers RESULTS.md quotes)."""

from __future__ import annotations

import runpy
from pathlib import Path

import pytest

BENCH = runpy.run_path(str(Path(__file__).resolve().parents[2] / "benchmarks" / "bench_arithmetic_limits.py"))


def _record(question: str, colours: list[str], answer: str) -> dict:
    return {"question": question, "answer": answer, "objects": [{"color": c} for c in colours],
            "template": "t"}


def test_sub_counts_are_read_from_the_question_and_the_objects():
    total = _record("How many red and blue objects are there in total?", ["red", "blue", "red", "green"], "3")
    more = _record("How many more red than blue objects are there?", ["red", "red", "red", "blue"], "2")
    assert BENCH["sub_counts"](total) == ("red", "blue", 2, 1, False)
    assert BENCH["sub_counts"](more) == ("red", "blue", 3, 1, True)
    with pytest.raises(ValueError, match="not an arithmetic question"):
        BENCH["sub_counts"](_record("Is there a star?", [], "yes"))


def test_limits_split_accuracy_by_sub_counts_and_measure_consistency():
    records = [
        _record("How many red and blue objects are there in total?", ["red", "blue", "red"], "3"),  # 2 + 1
        _record("How many more red than blue objects are there?", ["red", "red", "red", "blue"], "2"),  # 3 - 1
        _record("How many red and blue objects are there in total?", ["red", "blue"], "2"),  # 1 + 1
    ]
    # right sub-counts and answer; right sub-counts, wrong answer; wrong sub-count, answer = its own sum
    answers, first, second = ["3", "4", "3"], ["2", "3", "2"], ["1", "1", "1"]
    table = BENCH["arithmetic_limits"](records, answers, first, second)
    assert table["arithmetic"] == {"accuracy": round(1 / 3, 3), "n": 3}
    assert table["arithmetic | both sub-counts right"] == {"accuracy": 0.5, "n": 2}
    assert table["arithmetic | a sub-count wrong"] == {"accuracy": 0.0, "n": 1}
    assert table["answer = own sub-counts combined | both right"] == {"accuracy": 0.5, "n": 2}
    assert table["answer = own sub-counts combined | a sub-count wrong"] == {"accuracy": 1.0, "n": 1}
    assert table["sub-count c1"]["accuracy"] == round(2 / 3, 3) and table["sub-count c2"]["accuracy"] == 1.0
    assert BENCH["combine"]("x", "1", False) is None and BENCH["combine"]("3", "1", True) == "2"
    assert table["sub-count c1 answers"] == {"off by one": 1, "right": 2} and table["sub-count c2 answers"] == {"right": 3}


def test_miss_kinds_separate_off_by_one_from_another_colour_and_every_object():
    kind = BENCH["miss_kind"]
    colours = ["red"] * 6 + ["blue"] + ["green"] * 2  # 9 objects
    said = ["1", "2", "6", "9", "8", "4", "x"]
    assert [kind(s, "blue", colours) for s in said] == [
        "right", "off by one", "another colour's count", "the image's total +-1", "the image's total +-1", "other",
        "other"]
    assert kind("1", "green", colours) == "off by one"  # blue's count too, but off by one is checked first


def test_token_cells_are_the_grid_cells_an_object_touches():
    obj = {"center": [50.0, 10.0], "size": 5.0}  # x 45-55, y 5-15 on a 70-px image, 7 x 7 cells of 10 px
    assert BENCH["token_cells"](obj, 70, 7) == {(4, 0), (4, 1), (5, 0), (5, 1)}
    assert BENCH["token_cells"]({"center": [1.0, 69.0], "size": 3.0}, 70, 7) == {(0, 6)}  # clipped to the grid


def _subset(answer: str, objects: list[tuple[float, float, bool]], distractors: int) -> dict:
    """A counting/subset record: objects (x, y, asked?) of size 4 on a 70-px image."""
    objs = [{"id": i, "center": [x, y], "size": 4.0} for i, (x, y, _) in enumerate(objects)]
    return {"answer": answer, "distractors": distractors, "image_size": 70, "objects": objs,
            "targets": [i for i, (_, _, asked) in enumerate(objects) if asked]}


def test_subset_limits_sort_errors_and_split_by_distractors_and_shared_tokens():
    apart = _subset("1", [(15, 15, True), (55, 55, False)], 1)  # cells (1,1) and (5,5): nothing shared
    close = _subset("1", [(15, 15, True), (17, 15, False)], 1)  # the same cell
    crowded = _subset("2", [(15, 15, True), (35, 15, True)] + [(55, 5 + 15 * k, False) for k in range(4)], 4)
    records = [apart, close, crowded, crowded, crowded]
    table = BENCH["subset_limits"](records, ["1", "2", "6", "4", "3"], grid=7)
    assert table["answers"] == {"right": 1, "the total (asked + distractors)": 2, "the distractors' number": 1,
                                "off by one": 1}  # "2" for 1 asked + 1 distractor is the total, not off by one
    assert table["distractors 1"] == {"accuracy": 0.5, "n": 2} and table["distractors 4+"] == {"accuracy": 0.0, "n": 3}
    assert table["no token shared with a distractor"] == {"accuracy": 0.25, "n": 4}
    assert table["an asked object shares a token with a distractor"] == {"accuracy": 0.0, "n": 1}


def _poly(answer: str, boxes: list[tuple[int, int, int, int]]) -> dict:
    return {"answer": answer, "objects": [{"bbox": list(box)} for box in boxes]}


def test_closest_gap_is_the_box_gap_of_the_nearest_pair():
    boxes = [{"bbox": [0, 0, 10, 10]}, {"bbox": [14, 2, 20, 8]}, {"bbox": [0, 30, 10, 40]}]
    assert BENCH["closest_gap"](boxes) == 4  # 14 - 10 horizontally; the third box is 20 below
    assert BENCH["closest_gap"]([{"bbox": [0, 0, 10, 10]}, {"bbox": [5, 5, 15, 15]}]) == -5  # overlapping
    assert BENCH["closest_gap"](boxes[:1]) is None


def test_synpoly_limits_sort_misses_and_split_by_count_and_closeness():
    far = [(0, 0, 10, 10), (40, 40, 50, 50)]
    near = [(0, 0, 10, 10), (13, 0, 23, 10)]  # 3 px apart
    records = [_poly("2", far), _poly("2", near), _poly("2", near), _poly("1", [(0, 0, 5, 5)]),
               _poly("5", far + [(80, 80, 90, 90), (120, 0, 130, 10), (0, 120, 10, 130)])]
    table = BENCH["synpoly_limits"](records, ["2", "1", "2", "1", "7"])
    assert table["misses"] == {"one too few": 1, "other": 1}
    assert table["count 2-4"] == {"accuracy": round(2 / 3, 3), "n": 3}
    assert table["count 1"] == {"accuracy": 1.0, "n": 1}  # one object: no pair, so no closeness group
    assert table["closest gap <= 6 px"] == {"accuracy": 0.5, "n": 2}
    assert table["closest gap > 6 px"] == {"accuracy": 0.5, "n": 2}
    assert table["count 2-4, closest gap > 6 px"] == {"accuracy": 1.0, "n": 1}
    assert table["count 5-7, closest gap > 6 px"] == {"accuracy": 0.0, "n": 1}


def test_paired_rows_hold_the_same_images_for_two_models_and_test_them_exactly():
    records = [
        _record("How many red and blue objects are there in total?", ["red", "blue", "red"], "3"),  # sum, 2 + 1
        _record("How many more red than blue objects are there?", ["red", "red", "red", "blue"], "2"),  # difference
        _record("How many red and blue objects are there in total?", ["red", "blue"], "2"),  # sum, 1 + 1
    ]
    # model A: every answer right, second image's c2 sub-count wrong; model B: only the last sum right
    ours = BENCH["paired_hits"](records, ["3", "2", "2"], ["2", "3", "1"], ["1", "2", "1"])
    theirs = BENCH["paired_hits"](records, ["4", "1", "2"], ["2", "3", "1"], ["1", "1", "1"])
    assert ours == {"arithmetic": [True, True, True], "arithmetic/sum": [True, True],
                    "arithmetic/difference": [True], "sub-count c1": [True, True, True],
                    "sub-count c2": [True, False, True], "both sub-counts": [True, False, True]}
    table = BENCH["paired_against"](ours, theirs)
    # arithmetic: A alone right on 2 images, B alone on none: exact two-sided p = 2 * 0.5**2 = 0.5
    assert table["arithmetic"] == {"model": 1.0, "against": round(1 / 3, 3), "model_only": 2, "against_only": 0,
                                   "p": 0.5}
    assert table["sub-count c2"] == {"model": round(2 / 3, 3), "against": 1.0, "model_only": 0, "against_only": 1,
                                     "p": 1.0}
    assert table["arithmetic/difference"]["model_only"] == 1 and set(table) == set(ours)

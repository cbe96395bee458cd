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

"""benchmarks/compare_checkpoints.py's paired table on planted outcomes (the numbers RESULTS.md quotes)."""

import runpy
from pathlib import Path

import pytest

BENCH = runpy.run_path(str(Path(__file__).resolve().parents[2] / "benchmarks" / "compare_checkpoints.py"))


def test_paired_table_counts_discordant_images_per_source_and_pair():
    sources = ["colour"] * 4 + ["shape"] * 3
    hits = {"a": [True, True, True, True, False, False, True],
            "b": [False, False, False, True, True, False, True],
            "c": [True] * 7}
    table = BENCH["paired_table"](sources, hits)
    assert list(table) == ["a vs b", "a vs c", "b vs c"]
    colour = table["a vs b"]["colour"]
    assert (colour["a"], colour["b"], colour["a_only"], colour["b_only"]) == (1.0, 0.25, 3, 0)
    assert colour["p"] == pytest.approx(2 * 0.5 ** 3)  # two-sided exact binomial on 3 discordant images
    shape = table["a vs b"]["shape"]
    assert (shape["a_only"], shape["b_only"], shape["p"]) == (0, 1, 1.0)
    assert table["b vs c"]["colour"] == {"a": 0.25, "b": 1.0, "a_only": 0, "b_only": 3, "p": 0.25}

"""benchmarks/bench_fit_gap.py: the stage recipe it redraws and the gap it reports (numbers RESULTS.md quotes)."""

import math
import runpy
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = runpy.run_path(str(ROOT / "benchmarks" / "bench_fit_gap.py"))


def test_stage_recipe_is_the_shipped_v6_stage_settings():
    seed, examples, mix = BENCH["stage_recipe"](ROOT / "training" / "v6" / "lang1")
    assert (seed, examples) == (46, 24000)
    assert mix["counting/synpoly"] == pytest.approx(0.18 / 1.15)  # the script's weights, normalised
    assert sum(mix.values()) == pytest.approx(1.0)


def test_gap_is_the_unpaired_difference_with_its_normal_interval():
    train, fresh = [True] * 9 + [False], [True] * 6 + [False] * 4
    result = BENCH["gap"](train, fresh)
    se = math.sqrt(0.9 * 0.1 / 10 + 0.6 * 0.4 / 10)
    assert result["gap"] == pytest.approx(0.3)
    assert result["ci95"] == pytest.approx([round(0.3 - 1.96 * se, 3), round(0.3 + 1.96 * se, 3)])


def test_accuracy_reports_the_wilson_interval():
    result = BENCH["accuracy"]([True] * 8 + [False] * 2)
    assert result["accuracy"] == 0.8 and result["n"] == 10
    assert result["ci95"] == pytest.approx([0.490, 0.943], abs=1e-3)

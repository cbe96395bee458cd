"""Significance of what the tools conclude: the Jaccard null against brute-force enumeration and
simulation, Holm by hand, t quantiles and Fisher's test against scipy, and the ablation report's
p-values and stability statements."""

from __future__ import annotations

import itertools
import json
import math
import random

import pytest
import torch

from vlens.ablation import AblationReport, HeadAblation, holm_matrix, jaccard, jaccard_p_value
from vlens.ablation.stability import overlap_stability
from vlens.utils.stats import fisher_greater, holm, hypergeometric_tail, mean_interval, t_quantile


def _enumerated_p(n: int, size_a: int, size_b: int, observed: float) -> float:
    """P(J >= observed) over every pair of subsets of the given sizes (the definition of the null)."""
    units = [(0, u) for u in range(n)]
    hits = total = 0
    for a in itertools.combinations(units, size_a):
        for b in itertools.combinations(units, size_b):
            total += 1
            hits += jaccard(a, b) >= observed - 1e-12
    return hits / total


@pytest.mark.parametrize("n,size_a,size_b", [(7, 3, 3), (8, 2, 4), (6, 1, 5), (6, 6, 6)])
def test_jaccard_p_value_equals_brute_force_enumeration(n, size_a, size_b):
    a = [(0, u) for u in range(size_a)]
    for shared in range(max(0, size_a + size_b - n), min(size_a, size_b) + 1):
        b = [(0, u) for u in range(shared)] + [(0, n - 1 - u) for u in range(size_b - shared)]
        assert len(set(a) & set(b)) == shared
        expected = _enumerated_p(n, size_a, size_b, jaccard(a, b))
        assert jaccard_p_value(a, b, n) == pytest.approx(expected, abs=1e-12)


def test_jaccard_p_value_matches_simulation_and_the_issue_numbers():
    # two random top-8 sets of 32 heads: J = 3/13 (0.23) by chance 31% of the time, J = 4/12 (0.33) 8%
    a = [(0, u) for u in range(8)]
    three = a[:3] + [(1, u) for u in range(5)]
    four = a[:4] + [(1, u) for u in range(4)]
    assert jaccard_p_value(a, three, 32) == pytest.approx(0.3085, abs=1e-4)
    assert jaccard_p_value(a, four, 32) == pytest.approx(0.0822, abs=1e-4)
    rng = random.Random(0)
    heads = [(layer, head) for layer in range(4) for head in range(8)]
    draws = [jaccard(rng.sample(heads, 8), rng.sample(heads, 8)) for _ in range(20000)]
    for b in (three, four):
        simulated = sum(j >= jaccard(a, b) - 1e-12 for j in draws) / len(draws)
        assert simulated == pytest.approx(jaccard_p_value(a, b, 32), abs=0.012)  # ~4 standard errors
    with pytest.raises(ValueError, match="cannot come from"):
        jaccard_p_value(a, four, 7)


def test_hypergeometric_tail_and_fisher_against_scipy():
    stats = pytest.importorskip("scipy.stats")
    for i, population, successes, draws in [(0, 10, 3, 4), (2, 32, 8, 8), (5, 40, 10, 12), (9, 20, 8, 8)]:
        assert hypergeometric_tail(i, population, successes, draws) == pytest.approx(
            float(stats.hypergeom.sf(i - 1, population, successes, draws)), abs=1e-12)
    for table in ([9, 10, 3, 10], [40, 40, 30, 60], [0, 5, 5, 5]):
        hits_a, n_a, hits_b, n_b = table
        expected = stats.fisher_exact([[hits_a, n_a - hits_a], [hits_b, n_b - hits_b]], alternative="greater").pvalue
        assert fisher_greater(*table) == pytest.approx(float(expected), abs=1e-12)


def test_t_quantile_and_mean_interval_against_scipy():
    stats = pytest.importorskip("scipy.stats")
    for q, df in [(0.975, 1), (0.975, 2), (0.95, 4), (0.6, 3.5), (0.025, 9)]:
        assert t_quantile(q, df) == pytest.approx(float(stats.t.ppf(q, df)), rel=1e-7)
    interval = mean_interval([0.05, 0.07, 0.06])
    half = float(stats.t.ppf(0.975, 2)) * 0.01 / math.sqrt(3)
    assert interval["mean"] == pytest.approx(0.06) and interval["low"] == pytest.approx(0.06 - half)
    assert math.isnan(mean_interval([0.1])["low"])


def test_holm_by_hand():
    # sorted 0.005, 0.01, 0.03, 0.04 of m = 4: 0.02, 0.03, max(0.03, 0.06) = 0.06, max(0.06, 0.04) = 0.06
    adjusted = holm([0.01, 0.04, 0.03, float("nan"), 0.005])
    assert adjusted[:3] == pytest.approx([0.03, 0.06, 0.06]) and adjusted[4] == pytest.approx(0.02)
    assert math.isnan(adjusted[3])
    assert holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])
    p = torch.tensor([[float("nan"), 0.01, 0.04], [0.01, float("nan"), 0.03], [0.04, 0.03, float("nan")]])
    assert holm_matrix(p)[0, 1] == pytest.approx(0.03) and holm_matrix(p)[2, 1] == pytest.approx(0.06)


def _sweep(task: str, top: list[int], n: int = 32) -> HeadAblation:
    """A sweep of n heads (4 layers) whose top heads are `top` (flat indices), in that order."""
    drops = torch.zeros(n, dtype=torch.float64)
    for rank, index in enumerate(top):
        drops[index] = 10.0 - 0.1 * rank
    drops = drops.reshape(4, n // 4)
    return HeadAblation(task, "mean", "region", 8, 0.0, 1.0, -drops, 1.0 - drops.clamp(0, 1))


def test_report_writes_p_values_and_calls_stable_only_what_is_significant_on_both_samples():
    # counting shares 7 of 8 heads with arithmetic on both samples (p ~ 1e-6), colour 4 of 8 on the
    # first sample only (p = 0.08 before correction: never stable), 3 with shape (p = 0.31)
    base = list(range(8))
    results = {"counting": _sweep("counting", base), "arithmetic": _sweep("arithmetic", base[:7] + [20]),
               "colour": _sweep("colour", base[:4] + [24, 25, 26, 27]),
               "shape": _sweep("shape", base[:3] + [28, 29, 30, 31, 16])}
    retest = {"counting": _sweep("counting", base), "arithmetic": _sweep("arithmetic", base[:7] + [21]),
              "colour": _sweep("colour", [16, 17, 18, 19, 24, 25, 26, 27]),
              "shape": _sweep("shape", base[:3] + [28, 29, 30, 31, 17])}
    report = AblationReport(results, top_k=8, retest=retest)
    data = json.loads(json.dumps(report.to_dict()))
    names = data["tasks"]
    p = data["jaccard_p_value"]
    i, j, c = names.index("counting"), names.index("arithmetic"), names.index("colour")
    sets = report.head_sets()
    assert p[i][j] == pytest.approx(jaccard_p_value(sets["counting"], sets["arithmetic"], 32), rel=1e-5)
    assert p[i][c] == pytest.approx(0.0822, abs=1e-4) and p[i][i] is None
    assert data["jaccard_p_value_holm"][i][c] >= p[i][c]
    assert data["retest_jaccard"]["p_value"][i][j] < 1e-4
    assert data["reliability_p_value"]["counting"] < 1e-6
    stability = overlap_stability(report)
    assert stability.stable_pairs() == [("counting", "arithmetic")]
    lines = stability.findings(anchor="counting")
    assert any("counting vs arithmetic: above chance on both samples" in line and line.endswith("stable.")
               for line in lines)
    assert any(line.startswith("counting vs colour: not above chance on either sample") for line in lines)
    assert not any("colour" in line and line.endswith(": stable.") for line in lines)
    assert "(p 0.082)" in report.to_markdown()
    figure = report.plot()
    assert any("<b>" in str(t) for row in figure.data[0].text for t in row)  # counting-arithmetic in bold

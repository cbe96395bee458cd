"""Intervals and spreads (vlens.utils.stats) against hand-computed values."""

import math

import pytest
import torch

from vlens.utils.stats import bootstrap_interval, format_interval, spread, wilson_interval


def test_wilson_interval_matches_the_formula_by_hand():
    # k = 8, n = 10, z = 1.959964: centre (0.8 + z^2/20) / (1 + z^2/10), half width z/(1 + z^2/10) sqrt(.016 + z^2/400)
    z = 1.959963984540054
    centre = (0.8 + z * z / 20) / (1 + z * z / 10)
    half = z / (1 + z * z / 10) * math.sqrt(0.8 * 0.2 / 10 + z * z / 400)
    low, high = wilson_interval(8, 10)
    assert float(low) == pytest.approx(centre - half, abs=1e-9)
    assert float(high) == pytest.approx(centre + half, abs=1e-9)
    assert float(low) == pytest.approx(0.4902, abs=1e-4) and float(high) == pytest.approx(0.9433, abs=1e-4)


def test_wilson_interval_at_the_edges_and_elementwise():
    low, high = wilson_interval(torch.tensor([0, 5, 0]), torch.tensor([5, 5, 0]))
    assert float(low[0]) == 0.0 and 0 < float(high[0]) < 0.5  # 0 of 5 is not "certainly 0"
    assert 0.5 < float(low[1]) < 1 and float(high[1]) == pytest.approx(1.0)
    assert (float(low[2]), float(high[2])) == (0.0, 1.0)  # no data: anything
    with pytest.raises(ValueError, match="successes"):
        wilson_interval(6, 5)


def test_bootstrap_interval_is_seeded_covers_the_mean_and_shrinks_with_n():
    values = torch.tensor([0.0, 1.0] * 50)
    low, high = bootstrap_interval(values, seed=3)
    assert float(low) < 0.5 < float(high)
    assert (low, high) == bootstrap_interval(values, seed=3)  # reproducible
    wide = bootstrap_interval(torch.tensor([0.0, 1.0] * 5), seed=3)
    assert float(wide[1] - wide[0]) > float(high - low)
    constant = bootstrap_interval(torch.full((7, 3), 2.0))
    assert torch.equal(constant[0], torch.full((3,), 2.0, dtype=torch.float64))
    with_nan = bootstrap_interval(torch.tensor([1.0, float("nan"), 1.0]))
    assert float(with_nan[0]) == float(with_nan[1]) == 1.0  # NaN examples are left out


def test_spread_and_format():
    assert spread([0.4, 0.5, 0.6]) == pytest.approx({"n": 3, "mean": 0.5, "std": 0.1, "min": 0.4, "max": 0.6})
    assert spread([0.7])["std"] == 0.0
    assert spread([])["n"] == 0
    assert format_interval(0.81, 0.742, 0.87) == "0.81 [0.74, 0.87]"
    assert format_interval(float("nan"), 0, 1) == "n/a"


def test_format_share_is_the_share_with_its_wilson_interval():
    from vlens.utils.stats import format_share

    assert format_share(0.8, 10) == "0.80 [0.49, 0.94]"  # wilson_interval(8, 10) = (0.490, 0.943)
    assert format_share(float("nan"), 10) == "n/a" and format_share(0.5, 0) == "n/a"

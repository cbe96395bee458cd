"""Power of the Fisher test and the best split of the counts: exact values against simulation and hand cases."""

from __future__ import annotations

import pytest
import torch

from vlens.evaluation.subitizing import best_split
from vlens.utils.errors import UserInputError
from vlens.utils.power import fisher_power, fisher_rejection_region, minimum_detectable_gap
from vlens.utils.stats import fisher_greater


def test_rejection_region_is_where_fisher_rejects():
    region = fisher_rejection_region(6, 5)
    for x in range(7):
        for y in range(6):
            assert bool(region[x, y]) == (fisher_greater(x, 6, y, 5) < 0.05)


def test_power_equals_a_simulation_of_the_test():
    generator = torch.Generator().manual_seed(0)
    n_a, n_b, p_a, p_b, draws = 12, 18, 0.8, 0.4, 20_000
    x = torch.binomial(torch.full((draws,), float(n_a)), torch.full((draws,), p_a), generator=generator).long()
    y = torch.binomial(torch.full((draws,), float(n_b)), torch.full((draws,), p_b), generator=generator).long()
    region = fisher_rejection_region(n_a, n_b)
    simulated = float(region[x, y].double().mean())
    assert fisher_power(p_a, n_a, p_b, n_b) == pytest.approx(simulated, abs=0.012)  # 3.5 standard errors


def test_power_at_equal_accuracies_is_at_most_the_level_and_rises_with_the_gap():
    assert fisher_power(0.5, 20, 0.5, 20) <= 0.05
    powers = [fisher_power(p, 20, 0.5, 20) for p in (0.5, 0.7, 0.9, 1.0)]
    assert powers == sorted(powers) and powers[-1] > 0.99


def test_minimum_detectable_gap_is_where_power_reaches_80_percent():
    gap = minimum_detectable_gap(40, 40, 0.5)
    assert fisher_power(0.5 + gap, 40, 0.5, 40) >= 0.8 > fisher_power(0.5 + gap - 0.01, 40, 0.5, 40)
    assert minimum_detectable_gap(10, 10, 0.5) > gap  # fewer images: only larger gaps
    assert minimum_detectable_gap(2, 2, 0.9) is None  # nothing is detectable with 2 images a side
    with pytest.raises(UserInputError, match="power"):
        minimum_detectable_gap(10, 10, 0.5, power=1.5)


def test_best_split_finds_the_planted_break_and_pays_for_choosing_it():
    targets = [1 + i % 8 for i in range(320)]
    planted = best_split(targets, [t <= 5 or i % 3 == 0 for i, t in enumerate(targets)])
    assert planted.split == 5 and planted.p_value < 0.01
    assert planted.small_accuracy == 1.0 and planted.large_accuracy == pytest.approx(40 / 120)
    # no dependence on the count: the permutation p-value of the best of 7 splits is not small,
    # although the chosen split's own two-proportion z would look significant more often than 5%
    generator = torch.Generator().manual_seed(1)
    coin = (torch.rand(320, generator=generator) < 0.6).tolist()
    assert best_split(targets, coin).p_value > 0.05
    with pytest.raises(UserInputError, match="two distinct counts"):
        best_split([3, 3], [True, False])

"""Every normalised score divides by a gap between two runs; within that gap's noise floor it is NaN (null)
with a `NoiseFloorWarning` (`vlens.utils.noise_floor`): a circuit's faithfulness and its interval, the
transcoders' loss and KL recovered. Each on a case whose denominator is ~0 and on one where it is not,
against the value computed by hand."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

from tests.helpers.models import tiny_vlm
from vlens.circuits import faithfulness, faithfulness_interval
from vlens.testing import random_image
from vlens.transcoders import TranscoderConfig, Transcoders, evaluate_transcoders
from vlens.utils.noise_floor import NoiseFloorWarning, pooled_gap_floor

torch.set_num_threads(1)


def test_faithfulness_is_nan_when_clean_and_corrupt_barely_differ():
    # per-pair gaps +2.02, -1.98, +2.02, -1.98: mean 0.02, standard error 1.15 -> a ratio of noise
    clean = torch.tensor([3.02, 1.02, 3.02, 1.02], dtype=torch.float64)
    corrupt = torch.tensor([1.0, 3.0, 1.0, 3.0], dtype=torch.float64)
    patched = torch.tensor([[2.0, 2.1, 1.9, 2.0]], dtype=torch.float64)
    with pytest.warns(NoiseFloorWarning, match="the circuit's faithfulness is NaN: the mean clean minus corrupt "
                                               "metric 0.02 over 4 examples is within its noise floor"):
        value = faithfulness(patched, clean, corrupt)
    assert math.isnan(float(value[0]))  # before: (2.0 - 2.0) / 0.02 = 0 ... and 2.26 on other data
    low, high = faithfulness_interval(patched, clean, corrupt)
    assert math.isnan(float(low[0])) and math.isnan(float(high[0]))


def test_faithfulness_by_hand_when_the_gap_is_clear():
    clean = torch.tensor([3.0, 3.2, 2.8, 3.0], dtype=torch.float64)  # mean 3.0
    corrupt = torch.tensor([1.0, 1.1, 0.9, 1.0], dtype=torch.float64)  # mean 1.0
    patched = torch.tensor([[2.0, 2.2, 1.8, 2.0], [1.0, 1.0, 1.0, 1.0]], dtype=torch.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("error", NoiseFloorWarning)
        value = faithfulness(patched, clean, corrupt)
        low, high = faithfulness_interval(patched, clean, corrupt)
    assert torch.allclose(value, torch.tensor([0.5, 0.0], dtype=torch.float64), atol=1e-12)
    assert bool((low <= value + 1e-12).all() and (value - 1e-12 <= high).all())


def test_pooled_gap_floor_by_hand():
    # two prompts: summed differences 3 and 1 over 2 and 2 tokens -> D = 4 / 4 = 1;
    # residuals 3 - 2 = 1 and 1 - 2 = -1 -> SE = sqrt(2 / 1 * 2) / 4 = 0.5
    floor = pooled_gap_floor(torch.tensor([3.0, 1.0]), torch.tensor([2.0, 2.0]), magnitude=1.0)
    assert floor.denominator == 1.0 and abs(floor.standard_error - 0.5) < 1e-12 and floor.n == 2
    assert abs(floor.floor - 1.0) < 1e-12 and not floor.defined  # |1| is not above 2 * 0.5


def _examples(n: int) -> list[dict]:
    return [{"image": random_image(seed=i), "question": "How many dots are there?"} for i in range(n)]


def _zero_transcoders(model, layers=(0, 1)) -> Transcoders:
    """Transcoders that output 0: replacing the MLPs by them is exactly zero-ablating the MLPs."""
    return Transcoders(TranscoderConfig(kind="plt", activation="relu", d_model=model.cfg.d_model, d_tc=4,
                                        layers=tuple(layers)))


def test_transcoder_recovered_scores_are_nan_when_zeroing_the_mlps_changes_nothing():
    model = tiny_vlm("qwen2_5_vl", fresh=True)  # its weights are edited: not the shared copy
    with torch.no_grad():  # MLP outputs ~1e-7 of what they were: zeroing them moves the loss by float noise
        for block in model.blocks:
            block.mlp.down_proj.weight.mul_(1e-7)
    with pytest.warns(NoiseFloorWarning, match="the transcoders' loss recovered is NaN") as caught:
        result = evaluate_transcoders(model, _zero_transcoders(model), _examples(3), batch_size=2)
    assert any("the transcoders' KL recovered is NaN" in str(w.message) for w in caught)
    assert result.loss_recovered is None and result.kl_recovered is None  # before: a ratio of rounding errors
    assert not result.floors["loss"]["defined"] and not result.floors["kl"]["defined"]
    assert result.to_dict()["loss_recovered"] is None


def test_transcoder_recovered_scores_by_hand_when_zeroing_matters():
    model = tiny_vlm("qwen2_5_vl", fresh=True)  # its weights are edited: not the shared copy
    with torch.no_grad():  # MLPs that matter: zeroing them moves the loss far past its noise floor
        for block in model.blocks:
            block.mlp.down_proj.weight.mul_(30.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error", NoiseFloorWarning)
        result = evaluate_transcoders(model, _zero_transcoders(model), _examples(3), batch_size=2)
    # zero transcoders are the zero-ablation: nothing of the loss or the KL is recovered, exactly
    assert result.floors["loss"]["defined"] and result.floors["kl"]["defined"]
    assert abs(result.loss_transcoders - result.loss_zero) < 1e-6
    assert result.loss_recovered == pytest.approx(0.0, abs=1e-6)
    assert result.kl_recovered == pytest.approx(0.0, abs=1e-6)
    assert result.floors["loss"]["denominator"] == pytest.approx(result.loss_zero - result.loss_clean, rel=1e-9)

"""The patch effect's noise floor (fp32 and bf16), bootstrap intervals over pairs against a loop over
the resamples, and the two patching directions."""

from __future__ import annotations

import json
import warnings

import pytest
import torch

from tests.helpers.models import tiny_vlm
from tests.helpers.planted import plant_answers, planted_model, planted_pairs
from vlens.data import make_pair
from vlens.patching import Baseline, PairExample, build_pair_batch, examples_from_pairs, patch_layer_head
from vlens.patching.metrics import NoiseFloorWarning, effect_floor, metrics_from_reduced, reduce_patched
from vlens.utils.finite import json_safe
from vlens.utils.stats import bootstrap_counts

torch.set_num_threads(1)


def _same_image_pairs(n: int = 3, size: int = 56) -> list[PairExample]:
    """Pairs whose two roles see the same image but are labelled with different counts: the clean and
    corrupt runs are identical, so their logit difference vanishes."""
    out = []
    for pair in examples_from_pairs([make_pair(2 + i, 3 + i, seed=i, size=size) for i in range(n)]):
        out.append(PairExample(pair.pair_id, pair.clean_image, pair.clean_image, pair.clean_prompt,
                               pair.clean_prompt, pair.clean_answer, pair.corrupt_answer))
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_vanishing_clean_corrupt_difference_gives_nan_effect_and_names_the_cells(dtype):
    model = tiny_vlm("qwen2_5_vl", n_layers=2, d_model=32, n_heads=4, n_kv_heads=2, dtype=dtype)
    batch = build_pair_batch(model, _same_image_pairs())
    with pytest.warns(NoiseFloorWarning, match=r"NaN at 8 cells \(every cell\): L0H0, L0H1"):
        result = patch_layer_head(model, batch)
    assert torch.isnan(result["patch_effect"]).all()
    assert torch.isfinite(result["logit_diff"]).all()  # the other metrics stay
    assert result.effect_floor is not None and not result.effect_floor.defined
    data = json.loads(json.dumps(json_safe(result.to_dict()), allow_nan=False))
    assert all(v is None for row in data["patch_effect"] for v in row)
    assert data["patch_effect_floor"]["defined"] is False and data["patch_effect_floor"]["dtype"] == str(dtype)[6:]
    assert all(v is None for row in data["intervals"]["patch_effect"]["low"] for v in row)


def _baseline(dtype: torch.dtype, gap: float, n: int = 6, magnitude: float = 10.0) -> Baseline:
    """n pairs over a 4-token vocabulary; each run's largest |logit| is `magnitude`; the corrupt run's
    logit difference exceeds the clean run's by `gap` (+- 1% jitter) in every pair."""
    jitter = 1 + 0.01 * torch.linspace(-1, 1, n)
    clean = torch.tensor([magnitude, 1.0, 0.0, 0.0]).repeat(n, 1)
    corrupt = clean.clone()
    corrupt[:, 1] += gap * jitter
    return Baseline(clean.to(dtype), corrupt.to(dtype), torch.zeros(n, dtype=torch.long),
                    torch.ones(n, dtype=torch.long), dtype=dtype)


def test_floor_uses_the_dtype_resolution_at_the_logits_magnitude():
    # gap 0.5 at |logit| 10: 16 bf16 steps are 16 * 2^-7 * 10 = 1.25, so bf16 cannot resolve it; fp32 can
    patched = torch.tensor([[10.0, 1.25, 0.0, 0.0]]).repeat(6, 1)[None]
    for dtype, defined in ((torch.float32, True), (torch.bfloat16, False)):
        baseline = _baseline(dtype, 0.5)
        floor = effect_floor(baseline)
        assert floor.defined is defined
        assert floor.resolution == pytest.approx(torch.finfo(dtype).eps * 10.0, rel=1e-6)
        effect = metrics_from_reduced(*reduce_patched(patched.to(dtype), baseline.clean_tokens, baseline.corrupt_tokens),
                                      baseline)["patch_effect"]
        assert bool(effect.isnan().all()) is not defined
        if defined:
            assert float(effect[0]) == pytest.approx(0.25 / 0.5, rel=0.02)
    # a float32 model whose logits are upcast keeps the model's (bf16) resolution
    upcast = Baseline(*(getattr(_baseline(torch.float32, 0.5), f) for f in ("clean_logits", "corrupt_logits",
                                                                            "clean_tokens", "corrupt_tokens")),
                      dtype=torch.bfloat16)
    assert not effect_floor(upcast).defined
    # spread across pairs: differences of +-1 around a mean of 0.05 are noise, whatever the dtype
    noisy = _baseline(torch.float32, 0.05)
    noisy.corrupt_logits[:, 1] += torch.tensor([1.0, -1.0] * 3)
    assert not effect_floor(noisy).defined and effect_floor(noisy).standard_error > 0.3


@pytest.fixture(scope="module")
def planted():
    model = planted_model()
    batch = build_pair_batch(model, planted_pairs())
    plant_answers(model, batch, scale=50.0)
    return model, batch


def test_bootstrap_intervals_equal_a_loop_over_the_resampled_pairs(planted):
    model, batch = planted
    result = patch_layer_head(model, batch)
    assert result.effect_floor.defined and torch.isfinite(result["patch_effect"]).all()
    intervals = result.bootstrap(n_resamples=40, seed=3)
    counts = bootstrap_counts(batch.n_pairs, 40, 3).long()
    ld, prediction = result.per_pair["logit_diff"], result.per_pair["prediction"]
    b = result.baseline
    draws = {"patch_effect": [], "overwrite_rate": [], "logit_diff": []}
    for row in counts:  # each resample as an explicit list of pairs
        rows = torch.arange(batch.n_pairs).repeat_interleave(row)
        sub = Baseline(b.clean_logits[rows], b.corrupt_logits[rows], b.clean_tokens[rows], b.corrupt_tokens[rows])
        metrics = metrics_from_reduced(ld[..., rows], prediction[..., rows], sub)
        defined = effect_floor(sub).denominator
        if abs(defined) <= result.effect_floor.floor:
            metrics["patch_effect"] = torch.full_like(metrics["patch_effect"], float("nan"))
        for name in draws:
            draws[name].append(metrics[name].double())
    for name, values in draws.items():
        stacked = torch.stack(values)
        low, high = torch.nanquantile(stacked, torch.tensor([0.025, 0.975], dtype=torch.float64), dim=0)
        torch.testing.assert_close(intervals[name][0], low, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(intervals[name][1], high, rtol=1e-5, atol=1e-6)
    assert set(result.intervals) >= {"patch_effect", "overwrite_rate", "flip_away_rate", "logit_diff"}
    data = result.to_dict()
    assert data["intervals"]["patch_effect"]["low"][0] and data["direction"] == "noising"


def test_denoising_swaps_the_roles(planted):
    model, batch = planted
    noising = patch_layer_head(model, batch)
    denoising = patch_layer_head(model, batch, direction="denoising")
    assert denoising.direction == "denoising" and denoising.to_dict()["roles"] == {"base": "corrupt",
                                                                                  "source": "clean"}
    swapped = patch_layer_head(model, batch.swapped())
    torch.testing.assert_close(denoising["logit_diff"], swapped["logit_diff"])
    # the planted head carries the whole answer: noising it overwrites, denoising it restores
    assert float(noising["overwrite_rate"][1, 2]) == 1.0 and float(denoising["overwrite_rate"][1, 2]) == 1.0
    assert denoising.to_dict()["answers"]["clean_answers"] == ["3", "2"]  # the pairs' own labels
    with pytest.raises(ValueError, match="direction must be one of"), warnings.catch_warnings():
        patch_layer_head(model, batch, direction="sideways")

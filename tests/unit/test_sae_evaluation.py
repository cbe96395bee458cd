"""Splice evaluation on known answers: an exact SAE recovers all the loss, zeroing is the reference."""

from __future__ import annotations

import pytest
import torch

from tests.helpers.models import tiny_vlm
from vlens.core.answers import answer_ids, answer_logprobs, teacher_force
from vlens.sae import build_sae, make_config
from vlens.sae.evaluation import evaluate_splice
from vlens.testing import random_image
from vlens.utils.noise_floor import NoiseFloorWarning, floored_ratio, gap_floor

HOOK = "blocks.0.hook_resid_post"


def exact_sae(d: int):
    """relu(x) - relu(-x) = x: a standard SAE with W_enc = [I, -I], W_dec = [I; -I] reconstructs exactly."""
    sae = build_sae(make_config("standard", d_in=d, d_sae=2 * d, hook_name=HOOK, apply_b_dec_to_input=False))
    eye = torch.eye(d)
    with torch.no_grad():
        sae.W_enc.copy_(torch.cat([eye, -eye], dim=1))
        sae.W_dec.copy_(torch.cat([eye, -eye], dim=0))
    return sae


def test_exact_sae_recovers_everything_and_zeroing_matches_a_zero_hook():
    model = tiny_vlm("qwen2_5_vl")
    examples = [{"image": random_image(seed=i), "question": "How many dots are there?", "answer": "3"} for i in range(3)]
    with pytest.warns(NoiseFloorWarning, match="loss recovered at image positions is NaN: the mean zero-ablation minus "
                                                "clean loss .* is within its noise floor"):
        result = evaluate_splice(model, examples, exact_sae(model.cfg.d_model), batch_size=2)
    by_region = {row["positions"]: row for row in result.rows}
    assert set(by_region) == {"image", "text", "all"}
    for row in by_region.values():
        assert abs(row["loss_sae"] - row["loss_clean"]) < 1e-4
        assert row["accuracy_sae"] == row["accuracy_clean"]
    for region in ("text", "all"):  # zeroing these positions moves the loss well past its noise floor
        assert by_region[region]["loss_gap_floor"]["defined"]
        assert abs(by_region[region]["loss_recovered"] - 1.0) < 1e-3
    # zeroing the layer-0 image positions of this random model barely moves the loss (|gap| < 2 standard errors
    # over the examples): a ratio would be noise (it read 1.0 only because numerator and denominator coincide)
    assert by_region["image"]["loss_recovered"] is None and not by_region["image"]["loss_gap_floor"]["defined"]
    # the zeroed reference is the model with the hook's image positions set to 0
    inputs = model.prepare(images=[[e["image"]] for e in examples], prompts=[e["question"] for e in examples])
    answers = [answer_ids(model, "3")] * 3
    forced = teacher_force(model, inputs, answers)
    mask = forced.regions.mask("image", forced.seq_len).unsqueeze(-1)
    logits = model.run_with_hooks(forced, fwd_hooks=[(HOOK, lambda a, hook=None: a.masked_fill(mask, 0.0))])
    logprob, _ = answer_logprobs(logits, answers)
    assert abs(by_region["image"]["loss_zero"] - float(-logprob.mean())) < 1e-4


def test_the_noise_floor_rule_by_hand():
    # mean 0.01, standard error 0.5 (differences +-1 around it): within the floor, so NaN and a warning
    within = gap_floor(torch.tensor([1.01, -0.99, 1.01, -0.99], dtype=torch.float64))
    assert abs(within.denominator - 0.01) < 1e-12 and abs(within.standard_error - 0.5773502691896258) < 1e-9
    with pytest.warns(NoiseFloorWarning, match="the score is NaN: the gap 0.01 over 4 examples"):
        assert floored_ratio(0.02, within, "gap", "the score") != floored_ratio(0.02, within, "gap", "the score")
    # a clear gap (mean 2, standard error 0.0577) divides as usual
    clear = gap_floor(torch.tensor([2.0, 2.1, 1.9], dtype=torch.float64))
    assert clear.defined and abs(floored_ratio(1.0, clear, "gap", "the score") - 0.5) < 1e-12
    # one example: no standard error, only the dtype's resolution (16 float32 steps of the magnitude) guards it
    assert gap_floor(torch.tensor([1e-6]), magnitude=10.0).floor == 16 * torch.finfo(torch.float32).eps * 10.0

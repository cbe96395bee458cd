"""Splice evaluation on known answers: an exact SAE recovers all the loss, zeroing is the reference."""

from __future__ import annotations

import torch

from tests.helpers.models import tiny_vlm
from vlens.core.answers import answer_ids, answer_logprobs, teacher_force
from vlens.sae import build_sae, make_config
from vlens.sae.evaluation import evaluate_splice
from vlens.testing import random_image

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
    result = evaluate_splice(model, examples, exact_sae(model.cfg.d_model), batch_size=2)
    by_region = {row["positions"]: row for row in result.rows}
    assert set(by_region) == {"image", "text", "all"}
    for row in by_region.values():
        assert abs(row["loss_sae"] - row["loss_clean"]) < 1e-4
        assert abs(row["loss_recovered"] - 1.0) < 1e-3
        assert row["accuracy_sae"] == row["accuracy_clean"]
    # the zeroed reference is the model with the hook's image positions set to 0
    inputs = model.prepare(images=[[e["image"]] for e in examples], prompts=[e["question"] for e in examples])
    answers = [answer_ids(model, "3")] * 3
    forced = teacher_force(model, inputs, answers)
    mask = forced.regions.mask("image", forced.seq_len).unsqueeze(-1)
    logits = model.run_with_hooks(forced, fwd_hooks=[(HOOK, lambda a, hook=None: a.masked_fill(mask, 0.0))])
    logprob, _ = answer_logprobs(logits, answers)
    assert abs(by_region["image"]["loss_zero"] - float(-logprob.mean())) < 1e-4

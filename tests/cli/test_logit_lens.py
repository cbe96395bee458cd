"""Logit lens at the final prompt position."""

from __future__ import annotations

import json

import pytest
import torch

from tests.helpers.models import tiny_vlm
from vlens import SweepOptions
from vlens.data import make_task_sample, write_imagefolder
from vlens.lens.logit_lens import logit_lens, logit_lens_records
from vlens.testing import random_image

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def tiny():
    return tiny_vlm("qwen2_5_vl", n_layers=3, d_model=32, n_heads=4, n_kv_heads=2)


def test_last_layer_is_the_model_output_and_ranks_by_hand(tiny):
    inputs = tiny.prepare(images=[random_image(56, 56, 0), random_image(84, 56, 1)],
                          prompts=["How many dots are there?", "What colour is the shape?"])
    logits = tiny(inputs)[torch.arange(2), inputs.regions.final]
    # make the answer of row 0 the model's own top token (rank 1), row 1 its least likely token
    answers = torch.tensor([int(logits[0].argmax()), int(logits[1].argmin())])
    result = logit_lens(tiny, inputs, answers)
    assert result.probabilities.shape == (3, 2)
    probs = logits.softmax(-1)
    assert torch.allclose(result.probabilities[-1], probs[torch.arange(2), answers], atol=1e-6)
    assert result.ranks[-1].tolist() == [1, tiny.cfg.d_vocab]
    # an earlier layer by hand: ln_final + unembedding of the cached resid_post
    _, cache = tiny.run_with_cache(inputs, names_filter=lambda n: n == "blocks.0.hook_resid_post")
    manual = tiny.unembed(tiny.ln_final(cache["blocks.0.hook_resid_post"]))[torch.arange(2), inputs.regions.final]
    manual_rank = (manual > manual[torch.arange(2), answers][:, None]).sum(-1) + 1
    assert result.ranks[0].tolist() == manual_rank.tolist()
    assert result.top_tokens[0].tolist() == manual.argmax(-1).tolist()
    assert result.top1_accuracy.tolist()[-1] == 0.5


def test_records_and_cli(tiny, tmp_path):
    samples = [make_task_sample("counting", seed=i, size=56) for i in range(3)]
    write_imagefolder(samples, tmp_path / "data")
    from vlens.data import read_imagefolder

    result = logit_lens_records(tiny, read_imagefolder(tmp_path / "data"), options=SweepOptions(batch_size=2))
    assert result.ranks.shape == (3, 3) and result.answers == [s[1]["answer"] for s in samples]
    assert len(result.plot().data) == 2

    from vlens.cli import main

    out = tmp_path / "ll"
    assert main(["logit-lens", "--model", "random-tiny", "--data", str(tmp_path / "data"), "--out", str(out),
                 "--quiet"]) == 0
    data = json.loads((out / "results.json").read_text())
    assert (out / "logit_lens.html").is_file()
    assert data["n_examples"] == 3 and len(data["mean_probability"]) == len(data["layers"])

"""Translators: a planted affine map is recovered; training lowers KL on a tiny model; the read-out
matches the model; save/load round trip; a lens refuses another model."""

from __future__ import annotations

import hashlib
import json

import pytest
import torch

from tests.helpers.headlens_models import tiny_model, two_image_batch
from tests.helpers.models import tiny_vlm
from vlens import SweepOptions
from vlens.lens.corpus import collect_residuals, task_samples
from vlens.lens.readout import LensReadout, unembedding_hash
from vlens.lens.translators import (
    CONFIG_FILE,
    LensMismatchError,
    LensTraining,
    Translators,
    layer_kl,
    train_translators,
)

QUIET = SweepOptions(progress=False)

torch.set_num_threads(1)
QWEN = "Qwen2_5_VLForConditionalGeneration"


def test_recovers_a_planted_affine_map():
    """final = h + A* h + b* behind a linear unembedding: KL training finds A*, b* (identifiable
    because the vocabulary is larger than d_model, so no logit shift is representable)."""
    g = torch.Generator().manual_seed(0)
    d, vocab, n = 8, 40, 3000
    W_U = torch.randn(d, vocab, generator=g)
    A_true = 0.3 * torch.randn(d, d, generator=g) / d**0.5
    b_true = 0.5 * torch.randn(d, generator=g)
    h = torch.randn(n, d, generator=g)
    final = h + h @ A_true.T + b_true
    translators = Translators(2, d)
    report = train_translators(translators, torch.stack([h, final], 1), LensReadout(W_U),
                               training=LensTraining(steps=800, lr=0.02, batch_size=256, patience=100), progress=False)
    assert report.kl_before[0] > 0.3 and report.kl_after[0] < 1e-4
    torch.testing.assert_close(translators.A[0].detach(), A_true, atol=0.01, rtol=0)
    torch.testing.assert_close(translators.b[0].detach(), b_true, atol=0.01, rtol=0)
    # the last layer already is the final residual: its translator stays the identity
    assert translators.A[1].abs().max() == 0 and report.kl_after[1] < 1e-6


def test_zero_initialised_translator_is_the_identity():
    translators = Translators(3, 5)
    h = torch.randn(2, 3, 5)
    torch.testing.assert_close(translators.forward_all(h), h)
    torch.testing.assert_close(translators(h[:, 1], 1), h[:, 1])


def test_readout_reproduces_the_models_logits():
    model = tiny_model(QWEN)
    inputs = two_image_batch(model)
    logits, cache = model.run_with_cache(inputs, names_filter=lambda n: n.endswith("hook_resid_post"))
    final = cache[f"blocks.{model.cfg.n_layers - 1}.hook_resid_post"]
    torch.testing.assert_close(LensReadout.from_model(model).logits(final), logits, atol=1e-5, rtol=0)


def test_training_on_a_tiny_model_lowers_kl_with_early_stopping():
    model = tiny_model(QWEN)
    resid = collect_residuals(model, task_samples(16, size=56), positions="text", options=QUIET)
    assert resid.shape[1:] == (model.cfg.n_layers, model.cfg.d_model) and resid.shape[0] > 100
    translators = Translators.for_model(model)
    readout = LensReadout.from_model(model)
    report = train_translators(translators, resid, readout,
                               training=LensTraining(steps=400, lr=1e-2, eval_every=10, patience=3), progress=False)
    assert report.kl_after[0] < 0.5 * report.kl_before[0]
    assert report.kl_before[-1] == pytest.approx(0.0, abs=1e-6)
    assert report.best_step <= report.steps <= 400
    assert min(report.val_history) == pytest.approx(sum(report.kl_after) / len(report.kl_after), abs=1e-6)
    assert "| 0 |" in report.table()
    # the held-out KL per layer is what layer_kl says on the same rows
    assert layer_kl(Translators.for_model(model), resid, readout)[-1] == pytest.approx(0.0, abs=1e-6)


def test_unembedding_hash_is_sha256_of_fp32_bytes():
    model = tiny_model(QWEN)
    expected = hashlib.sha256(model.unembed.W_U_unfolded.detach().float().cpu().contiguous().numpy().tobytes()).hexdigest()[:16]
    assert unembedding_hash(model) == expected


def test_save_load_round_trip(tmp_path):
    model = tiny_model(QWEN)
    translators = Translators.for_model(model)
    with torch.no_grad():
        translators.A.normal_(0, 0.1)
        translators.b.normal_(0, 0.1)
    translators.info["training"] = {"kl_before": [1.0, 0.0]}
    folder = translators.save(tmp_path / "lens")
    config = json.loads((folder / CONFIG_FILE).read_text())
    assert config["n_layers"] == model.cfg.n_layers and config["d_model"] == model.cfg.d_model
    assert config["unembed_hash"] == unembedding_hash(model)
    loaded = Translators.load(folder, model=model)
    torch.testing.assert_close(loaded.A, translators.A, atol=0, rtol=0)
    torch.testing.assert_close(loaded.b, translators.b, atol=0, rtol=0)
    assert loaded.info == translators.info


def test_a_lens_for_another_model_is_refused(tmp_path):
    model = tiny_model(QWEN)
    folder = Translators.for_model(model).save(tmp_path / "lens")
    other = tiny_vlm("qwen2_5_vl", seed=7, n_layers=2, d_model=64, n_heads=4, n_kv_heads=2)
    with pytest.raises(LensMismatchError, match="unembedding hash .* Train a lens for this model"):
        Translators.load(folder, model=other)
    deeper = tiny_vlm("qwen2_5_vl", n_layers=3)
    with pytest.raises(LensMismatchError, match="3 x 64"):
        Translators.load(folder, model=deeper)
    with pytest.raises(FileNotFoundError, match="config.json"):
        Translators.load(tmp_path / "nowhere")


def test_bad_training_input_is_explained():
    with pytest.raises(ValueError, match=r"resid must be \[n, 2, 4\]"):
        train_translators(Translators(2, 4), torch.zeros(10, 3, 4), LensReadout(torch.zeros(4, 6)), progress=False)


def test_collected_residuals_are_the_chosen_positions():
    model = tiny_model(QWEN)
    samples = task_samples(3, size=56)
    inputs = model.prepare(images=[s[0] for s in samples], prompts=[s[1] for s in samples])
    _, cache = model.run_with_cache(inputs, names_filter=lambda n: n.endswith("hook_resid_post"))
    final = collect_residuals(model, samples, positions="final", options=QUIET)
    rows = torch.arange(3)
    for layer in range(model.cfg.n_layers):
        torch.testing.assert_close(final[:, layer], cache[f"blocks.{layer}.hook_resid_post"][rows, inputs.regions.final])
    text = collect_residuals(model, samples, positions="text", options=QUIET)
    assert text.shape[0] == sum(len(t) for t in inputs.regions.text)
    with pytest.raises(ValueError, match="positions must be one of"):
        collect_residuals(model, samples, positions="image", options=QUIET)

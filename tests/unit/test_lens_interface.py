"""The `Lens` interface: the logit lens, the tuned lens and HeadLens read a residual the same way
(`forward(resid, layer) -> logits`), by hand-checkable identities."""

from __future__ import annotations

import pytest
import torch

from tests.helpers.headlens_models import tiny_model
from vlens.lens.base import Lens
from vlens.lens.headlens import HeadLens
from vlens.lens.logit_lens import LogitLens, logit_lens
from vlens.lens.translators import Translators, TunedLens

QWEN = "Qwen2_5_VLForConditionalGeneration"


def _resid(model, n: int = 5, seed: int = 0):
    return torch.randn(n, model.cfg.d_model, generator=torch.Generator().manual_seed(seed))


def test_every_lens_is_a_lens_and_the_base_is_abstract():
    model = tiny_model(QWEN)
    lenses = [LogitLens(model), TunedLens.from_model(model), HeadLens(model)]
    assert all(isinstance(lens, Lens) for lens in lenses)
    with pytest.raises(TypeError, match="abstract"):
        Lens()  # type: ignore[abstract]
    # the logit lens holds no parameters of its own (the model's stay the model's)
    assert list(LogitLens(model).parameters()) == []


def test_logit_lens_is_the_models_own_readout():
    model = tiny_model(QWEN)
    resid = _resid(model)
    lens = LogitLens(model)
    torch.testing.assert_close(lens(resid, 1), model.unembed(model.ln_final(resid)), rtol=0, atol=0)
    assert torch.equal(lens.transform(resid, 1), resid)


def test_tuned_lens_applies_the_layers_translator_then_the_readout():
    model = tiny_model(QWEN)
    resid = _resid(model)
    translators = Translators.for_model(model)
    with torch.no_grad():  # T_1(h) = h + h @ A^T + b with A = 0.5 I, b = 1: T_1(h) = 1.5 h + 1
        translators.A[1] = 0.5 * torch.eye(model.cfg.d_model)
        translators.b[1] = 1.0
    lens = TunedLens.from_model(model, translators)
    torch.testing.assert_close(lens.transform(resid, 1), 1.5 * resid + 1.0)
    torch.testing.assert_close(lens(resid, 1), LogitLens(model)(1.5 * resid + 1.0, 1), atol=1e-4, rtol=1e-4)
    # layer 0's translator is still the identity: the tuned lens reads like the logit lens there
    torch.testing.assert_close(lens(resid, 0), LogitLens(model)(resid, 0), atol=1e-4, rtol=1e-4)


def test_headlens_reads_a_residual_as_its_tuned_lens():
    model = tiny_model(QWEN)
    resid = _resid(model)
    translators = Translators.for_model(model)
    with torch.no_grad():
        translators.b[0] = 0.25
    head_lens, tuned = HeadLens(model, translators), TunedLens.from_model(model, translators)
    torch.testing.assert_close(head_lens(resid, 0), tuned(resid, 0), rtol=0, atol=0)


def test_logit_lens_accepts_any_lens():
    model = tiny_model(QWEN)
    inputs = model.prepare(images=[None, None], prompts=["How many dots are there ?", "What colour is it ?"])
    answers = torch.tensor(model.to_tokens(["3", "red"])[:, 0])
    default = logit_lens(model, inputs, answers)
    tuned = logit_lens(model, inputs, answers, lens=TunedLens.from_model(model))  # identity translators
    torch.testing.assert_close(tuned.probabilities, default.probabilities, atol=1e-5, rtol=1e-4)
    assert torch.equal(tuned.top_tokens, default.top_tokens)

"""vlens.lens.kl: the training KL (target terms once per row + one logsumexp) is the exact
KL(final || lens): its value against a hand computation, its value and gradient against the
elementwise formula (with and without a final norm and a bias), and `layer_kl` on a tiny model."""

from __future__ import annotations

import math

import pytest
import torch

from tests.helpers.headlens_models import tiny_model
from vlens import SweepOptions
from vlens.lens.corpus import collect_residuals, task_samples
from vlens.lens.kl import ReadoutLogSumExp, TargetTerms, direct_kl, layer_kl
from vlens.lens.readout import LensReadout
from vlens.lens.translators import Translators

torch.set_num_threads(1)


def elementwise_kl(target_logits, lens_logits):
    log_p = torch.log_softmax(target_logits, dim=-1)
    return (log_p.exp() * (log_p - torch.log_softmax(lens_logits, dim=-1))).sum(-1)


def test_kl_of_a_two_word_readout_by_hand():
    """W_U = I (2 words, no norm): final [log 3, 0] -> p = (3/4, 1/4); lens input [0, 0] -> q = (1/2, 1/2).
    KL = 3/4 log(3/2) + 1/4 log(1/2)."""
    readout = LensReadout(torch.eye(2))
    targets = TargetTerms(torch.tensor([[math.log(3.0), 0.0]]), readout)
    value = targets.kl(torch.tensor([0]), torch.zeros(1, 2))
    expected = 0.75 * math.log(1.5) + 0.25 * math.log(0.5)
    assert value.item() == pytest.approx(expected, abs=1e-7)
    # the same rows again: the cached terms give the same number
    assert targets.kl(torch.tensor([0]), torch.zeros(1, 2)).item() == pytest.approx(expected, abs=1e-7)
    # equal distributions: zero
    assert targets.kl(torch.tensor([0]), torch.tensor([[math.log(3.0), 0.0]])).item() == pytest.approx(0, abs=1e-7)


@pytest.mark.parametrize("norm,bias", [(False, False), (True, False), (True, True)])
def test_value_and_gradient_equal_the_elementwise_kl(norm, bias):
    g = torch.Generator().manual_seed(0)
    d, vocab, n = 6, 50, 9
    readout = LensReadout(torch.zeros(d, vocab))  # LensReadout keeps fp32: float64 here for a 1e-10 comparison
    readout.W_U = 2 * torch.randn(d, vocab, generator=g, dtype=torch.float64)
    readout.b_U = torch.randn(vocab, generator=g, dtype=torch.float64) if bias else None
    readout.norm_weight = 1 + 0.3 * torch.randn(d, generator=g, dtype=torch.float64) if norm else None
    final = torch.randn(n, d, generator=g, dtype=torch.float64)
    targets = TargetTerms(final, readout)
    rows = torch.tensor([4, 1, 4, 7])  # a repeated row, rows in any order
    x = torch.randn(len(rows), d, generator=g, dtype=torch.float64, requires_grad=True)
    value = targets.kl(rows, x)
    (grad,) = torch.autograd.grad(value.sum(), x)
    x_ref = x.detach().clone().requires_grad_(True)
    reference = elementwise_kl(readout.logits(final[rows]).double(), readout.logits(x_ref).double())
    (grad_ref,) = torch.autograd.grad(reference.sum(), x_ref)
    torch.testing.assert_close(value, reference, atol=1e-10, rtol=0)
    torch.testing.assert_close(grad, grad_ref, atol=1e-10, rtol=0)
    assert bool(targets.filled[[1, 4, 7]].all()) and not bool(targets.filled[[0, 2]].any())


def test_readout_logsumexp_equals_torch_logsumexp_and_refuses_a_second_backward():
    g = torch.Generator().manual_seed(1)
    W_U, b_U = torch.randn(4, 30, generator=g, dtype=torch.float64), torch.randn(30, generator=g, dtype=torch.float64)
    u = torch.randn(3, 4, generator=g, dtype=torch.float64, requires_grad=True)
    weights = torch.tensor([0.5, -1.0, 2.0], dtype=torch.float64)
    value = ReadoutLogSumExp.apply(u, W_U, b_U)
    reference = torch.logsumexp(u @ W_U + b_U, -1)
    torch.testing.assert_close(value, reference, atol=1e-12, rtol=0)
    (grad,) = torch.autograd.grad((value * weights).sum(), u, retain_graph=True)
    (grad_ref,) = torch.autograd.grad((reference * weights).sum(), u)
    torch.testing.assert_close(grad, grad_ref, atol=1e-12, rtol=0)
    # the backward reuses its buffer: a second backward through the same graph fails loudly, never silently wrong
    with pytest.raises(RuntimeError, match="inplace"):
        torch.autograd.grad(value.sum(), u)


def test_layer_kl_on_a_tiny_model_equals_the_per_layer_formula():
    model = tiny_model("Qwen2_5_VLForConditionalGeneration")
    resid = collect_residuals(model, task_samples(4, size=56), positions="text",
                              options=SweepOptions(progress=False))[:40]
    readout = LensReadout.from_model(model)
    translators = Translators.for_model(model)
    with torch.no_grad():
        translators.A.normal_(0, 0.05, generator=torch.Generator().manual_seed(2))
    expected = torch.stack([
        elementwise_kl(readout.logits(resid[:, -1]), readout.logits(translators(resid[:, layer], layer))).mean()
        for layer in range(translators.n_layers)]).detach()
    torch.testing.assert_close(layer_kl(translators, resid, readout, batch_size=7), expected, atol=1e-6, rtol=1e-5)
    log_p = torch.log_softmax(readout.logits(resid[:, -1]), -1)
    torch.testing.assert_close(direct_kl(log_p, log_p.exp(), readout.logits(resid[:, -1])),
                               torch.zeros(len(resid)), atol=1e-6, rtol=0)

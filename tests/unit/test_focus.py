"""L_focus: pixel -> merged grid, the Gaussian prior, the loss against hand-computed values,
and the hooked version on a tiny model (batches, several images, only target layers explicit)."""

from __future__ import annotations

import math

import pytest
import torch

from vlens.core.components.attention import Attention
from vlens.interventions.focus import (
    FocusPrior,
    capture_patterns,
    default_focus_layers,
    focus_loss,
    focus_prior,
    object_prior,
    pixel_to_grid,
    run_with_focus,
)
from vlens.testing import random_image


def test_default_layers_are_the_papers_on_28_layers():
    assert default_focus_layers(28) == [2, 18, 19, 20, 21, 22]
    assert default_focus_layers(4) == [0, 2]
    assert default_focus_layers(1) == [0]


def test_pixel_to_grid_on_an_image_resized_by_the_processor(qwen_pair):
    _, model = qwen_pair("qwen2_5_vl")
    # 150 x 90 px is resized to 140 x 84 px by smart_resize: 10 x 6 patches -> merged grid 3 x 5
    inputs = model.prepare(images=[random_image(150, 90)], prompts=["How many dots are there?"])
    grid = inputs.regions.image_grid[0][0]
    assert grid == (3, 5) and tuple(inputs.image_grid_thw[0].tolist()) == (1, 6, 10)
    # cell (r, c) covers x in [30c, 30c + 30), y in [30r, 30r + 30) of the ORIGINAL image
    centres = [(15.0, 15.0), (135.0, 75.0), (75.0, 45.0), (0.0, 0.0)]
    expected = [[0.0, 0.0], [2.0, 4.0], [1.0, 2.0], [-0.5, -0.5]]
    assert pixel_to_grid(centres, (150, 90), grid).tolist() == expected


def test_object_prior_by_hand():
    # 2 x 2 grid, one object at the centre of cell (0, 0), sigma 1: u = [1, e^-1/2, e^-1/2, e^-1]
    g = object_prior([(10.0, 10.0)], (40, 40), (2, 2), sigma=1.0)
    u = torch.tensor([1.0, math.exp(-0.5), math.exp(-0.5), math.exp(-1.0)], dtype=torch.float64)
    torch.testing.assert_close(g, u / u.sum())
    # sigma 2 on a 1 x 3 row, objects at cells 0 and 2: u(p) = sum_k exp(-d^2 / 8)
    u2 = object_prior([(5.0, 5.0), (25.0, 5.0)], (30, 10), (1, 3), sigma=2.0, normalise=False)
    torch.testing.assert_close(
        u2, torch.tensor([1 + math.exp(-0.5), 2 * math.exp(-1 / 8), 1 + math.exp(-0.5)], dtype=torch.float64)
    )


def test_focus_loss_by_hand():
    # one row: 2 text tokens (positions 0, 5) around 4 image tokens (positions 1-4); query = position 5
    g = [1.0, math.exp(-0.5), math.exp(-0.5), math.exp(-1.0)]
    g = [v / sum(g) for v in g]
    weights = torch.tensor([[0.0, *g, 0.0]])
    prior = FocusPrior(weights, torch.tensor([[False, True, True, True, True, False]]), torch.tensor([True]))
    head0 = [0.2, 0.2, 0.2, 0.1, 0.1, 0.2]
    head1 = [0.1, 0.1, 0.3, 0.3, 0.1, 0.1]
    rows = torch.tensor([[[head0, head1]]])  # [batch 1, T 1, heads 2, key 6]
    # mean over heads on the image: [0.15, 0.25, 0.2, 0.1] (sum 0.7) -> q = [3, 5, 4, 2] / 14
    q = [3 / 14, 5 / 14, 4 / 14, 2 / 14]
    expected_layer = -sum(gj * math.log(qj + 1e-8) for gj, qj in zip(g, q, strict=True))
    # a second layer attending uniformly over the image: q = 1/4 each -> log 4
    uniform = torch.tensor([[[[0.5, 0.125, 0.125, 0.125, 0.125, 0.0]] * 2]])
    loss = focus_loss({3: rows, 7: uniform}, prior)
    assert loss.item() == pytest.approx((expected_layer + math.log(4 + 4e-8)) / 2, rel=1e-6)


def test_focus_loss_averages_query_tokens_and_skips_rows_without_objects():
    prior = FocusPrior(
        torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 0.0]]),
        torch.tensor([[False, True, True], [False, True, True]]),
        torch.tensor([True, False]),
    )
    # row 0, two queries: q(target) = 0.5 and 0.25 -> mean of -log
    rows = torch.tensor([[[[0.0, 0.5, 0.5]], [[0.2, 0.2, 0.6]]], [[[1.0, 0.0, 0.0]], [[1.0, 0.0, 0.0]]]])
    loss = focus_loss({0: rows}, prior)
    assert loss.item() == pytest.approx((-math.log(0.5 + 1e-8) - math.log(0.25 + 1e-8)) / 2, rel=1e-6)


def test_hooked_focus_loss_matches_full_patterns_and_backpropagates(qwen_pair, monkeypatch):
    _, model = qwen_pair("qwen2_5_vl")
    images = [
        random_image(84, 56, seed=1),
        [random_image(56, 56, seed=2), random_image(112, 56, seed=3)],
        None,
    ]
    inputs = model.prepare(images=images, prompts=["How many dots are there?", "what colour ?", "yes"])
    objects = [
        [([(10.0, 20.0), (70.0, 30.0)], (84, 56))],
        [([(28.0, 28.0)], (56, 56)), ([], (112, 56))],
        None,
    ]
    prior = focus_prior(inputs, objects, sigma=1.0)
    assert prior.valid.tolist() == [True, True, False]
    # row 1: the second image has no objects, so g lives on the first image's tokens only
    second = inputs.regions.images[1][1]
    assert prior.weights[1, second].sum() == 0 and prior.weights[1].sum().item() == pytest.approx(1.0)

    explicit_layers = []
    original = Attention._explicit_attention

    def spy(self, *args, **kwargs):
        explicit_layers.append(self.layer)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Attention, "_explicit_attention", spy)
    logits, loss = run_with_focus(model, inputs, prior, layers=[1])
    assert explicit_layers == [1]  # layer 0 kept the SDPA path

    # the same number from the full cached pattern, computed directly
    _, cache = model.run_with_cache(inputs, names_filter="blocks.1.attn.hook_pattern")
    pattern = cache["blocks.1.attn.hook_pattern"]
    expected = []
    for row in (0, 1):
        attn = pattern[row, :, inputs.regions.final[row]].mean(0)[inputs.regions.image[row]]
        q = attn / attn.sum()
        expected.append(-(prior.weights[row, inputs.regions.image[row]].float() * torch.log(q + 1e-8)).sum())
    assert loss.item() == pytest.approx(torch.stack(expected).mean().item(), rel=1e-5)

    q_weight = model.blocks[1].attn.q_proj.weight
    q_weight.requires_grad_(True)
    try:
        with capture_patterns(model, [1], inputs.regions.final) as captured:
            model(inputs)
        focus_loss(captured, prior).backward()
        assert q_weight.grad is not None and q_weight.grad.abs().sum() > 0
    finally:
        q_weight.grad = None
        q_weight.requires_grad_(False)  # the fixture's model is shared across tests
    assert not model.blocks[1].attn.needs_pattern()  # hooks removed


def test_focus_prior_rejects_mismatched_objects(qwen_pair):
    _, model = qwen_pair("qwen2_5_vl")
    inputs = model.prepare(images=[random_image()], prompts=["How many dots are there?"])
    with pytest.raises(ValueError, match="one entry per row"):
        focus_prior(inputs, [None, None])
    with pytest.raises(ValueError, match="for every image"):
        focus_prior(inputs, [[([(1.0, 1.0)], (56, 56))] * 2])

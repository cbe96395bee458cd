"""Known answers: EAP is exact for a metric linear in an edge; EAP-IG converges to the exact integral.

- With the final norm's scale held fixed (a hook on `ln_final.hook_scale`), the logit difference
  is linear in the logits' input, so the EAP score of every edge into the logits equals its exact
  effect; with the last layer's ln1 scale fixed too and its MLP removed, so does every edge into
  that layer's values.
- Along the inputs' path corrupt -> clean, the integrated gradients of all input nodes add up to
  M(corrupt) - M(clean) exactly (the path's two ends), so the sum of EAP-IG over the edges out of
  the input nodes converges to it, the right Riemann sum's error shrinking like 1/steps; per edge,
  EAP-IG converges to the integral computed by Gauss-Legendre quadrature with plain hooks
  (`tests.helpers.circuits_reference`).
"""

from __future__ import annotations

import pytest
import torch

from tests.helpers import circuits_reference as ref
from tests.helpers.models import tiny_vlm
from vlens.circuits import edge_attribution, path_patch
from vlens.data import make_pair
from vlens.patching import build_pair_batch

torch.set_num_threads(1)
CONFIG = dict(n_layers=2, d_model=40, n_heads=4, n_kv_heads=2, d_mlp=48, initializer_range=0.1)


def fixed_scale(model, batch, name: str):
    """A hook holding the norm at `name` to the clean run's scale (any stacking of the pairs)."""
    with torch.no_grad():
        _, cache = model.run_with_cache(batch.clean, names_filter=lambda n: n == name)
    full = cache[name]  # [n, pos, 1]
    final = full[torch.arange(batch.n_pairs), batch.final][:, None]  # [n, 1, 1]: what the readout reads

    def hook(act, hook):
        source = full if act.shape[1] == full.shape[1] else final
        return source.repeat(act.shape[0] // batch.n_pairs, 1, 1).to(act.dtype)

    return hook


@pytest.fixture(scope="module")
def model_and_batch():
    model = tiny_vlm("qwen2_5_vl", seed=4, fresh=True, **CONFIG)
    with torch.no_grad():
        model.blocks[-1].mlp.down_proj.weight.zero_()  # the last layer's values reach the logits linearly
    # two image sizes: two prompt lengths, so the batch is left-padded
    batch = build_pair_batch(model, [make_pair(1, 3, seed=1, size=56), make_pair(4, 2, seed=2, size=84)])
    return model, batch


def test_eap_equals_path_patching_for_a_metric_linear_in_the_edge(model_and_batch):
    model, batch = model_and_batch
    last = model.cfg.n_layers - 1
    hooks = [("ln_final.hook_scale", fixed_scale(model, batch, "ln_final.hook_scale")),
             (f"blocks.{last}.ln1.hook_scale", fixed_scale(model, batch, f"blocks.{last}.ln1.hook_scale"))]
    with model.hooks(fwd_hooks=hooks):
        scores = edge_attribution(model, batch, method="eap", image_nodes="image")
        graph = scores.graph
        linear = [e for e in range(graph.n_edges)
                  if graph.receivers[int(graph.edge_receiver[e])].kind == "logits"
                  or (graph.receivers[int(graph.edge_receiver[e])].kind == "v"
                      and graph.receivers[int(graph.edge_receiver[e])].layer == last)]
        exact = path_patch(model, batch, linear, image_nodes="image")
    estimates = scores.scores[linear]
    assert float(exact.effects.abs().max()) > 1e-3
    assert torch.allclose(estimates, exact.effects, rtol=1e-4, atol=1e-6), (estimates - exact.effects).abs().max()
    # without the fixed scales the same edges are no longer linear: EAP is then only an estimate
    free = edge_attribution(model, batch, method="eap", image_nodes="image").scores[linear]
    assert float((free - estimates).abs().max()) > 1e-6


def test_eap_ig_adds_up_to_the_path_ends_with_error_shrinking_like_one_over_steps(model_and_batch):
    model, batch = model_and_batch
    errors = {}
    for steps in (2, 8, 32):
        scores = edge_attribution(model, batch, method="eap-ig", ig_steps=steps, image_nodes="image")
        graph = scores.graph
        inputs = (graph.edge_sender < graph.n_inputs)
        total = scores.per_pair[:, inputs].sum(1)  # per pair
        exact = scores.corrupt_metric - scores.clean_metric
        errors[steps] = float((total - exact).abs().max())
        scale = float(exact.abs().max())
    assert scale > 1e-3
    assert errors[32] < 2e-2 * scale
    assert errors[32] < errors[8] / 2.5 < errors[2] / 2.5 ** 2  # ~1/steps: 4x per 4x the steps


def test_eap_ig_per_edge_converges_to_the_quadrature_of_plain_hooks(model_and_batch):
    model, batch = model_and_batch
    references = ref.caches(model, batch)
    edges = [("img0", "L0H1.q"), ("L0H2", "L1H0-1.k"), ("MLP0", "logits")]
    expected = [ref.integrated_reference(model, batch, s, r, nodes=12, references=references) for s, r in edges]
    coarse = edge_attribution(model, batch, method="eap-ig", ig_steps=4, image_nodes="image")
    fine = edge_attribution(model, batch, method="eap-ig", ig_steps=64, image_nodes="image")
    for (sender, receiver), value in zip(edges, expected, strict=True):
        name = f"{sender}->{receiver}"
        err_coarse, err_fine = abs(coarse.score(name) - value), abs(fine.score(name) - value)
        assert err_fine <= 1e-2 * abs(value) + 1e-7, f"{name}: {fine.score(name)} vs {value}"
        assert err_fine < err_coarse / 4 or err_coarse < 1e-7, f"{name}: {err_coarse} -> {err_fine}"
    # the endpoint alpha = 1 of the integrand is the EAP score itself
    eap = edge_attribution(model, batch, method="eap", image_nodes="image")
    sender, receiver = edges[1]
    assert abs(eap.score(f"{sender}->{receiver}") - ref.edge_integrand(model, batch, sender, receiver, 1.0,
                                                                      references)) < 1e-6

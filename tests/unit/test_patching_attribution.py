"""Attribution patching: exact where the model is linear in the patched activation; AtP* for saturated attention."""

from __future__ import annotations

import math

import pytest
import torch

from tests.helpers.planted import PLANTED_HEAD, PLANTED_LAYER, plant_answers, planted_model, planted_pairs
from vlens.patching import (
    PatchSpec,
    attribution_patching,
    build_pair_batch,
    patch_layer_head,
    patch_metrics,
    spearman,
)
from vlens.patching.runner import run_specs

torch.set_num_threads(1)


def _frozen_final_norm(model):
    """Hold ln_final's scale fixed: everything after the last layer becomes linear."""
    return model.hooks(fwd_hooks=[("ln_final.hook_scale", lambda scale, hook: torch.full_like(scale, 0.02))])


@pytest.fixture(scope="module")
def planted():
    # chat=False: the prompts end on the differing token, so queries at the final position differ too
    model = planted_model(query_scale=8.0)
    batch = build_pair_batch(model, planted_pairs(), chat=False)
    plant_answers(model, batch, scale=50.0)
    return model, batch


def _exact_delta(model, batch, component, n_cells, region="all"):
    specs = [PatchSpec(layer, component, batch.region_mask(region), head=h)
             for layer in range(model.cfg.n_layers) for h in range(n_cells)]
    logits, baseline = run_specs(model, batch, specs)
    metrics = patch_metrics(logits, baseline)
    return (metrics["logit_diff"] - baseline.clean_logit_diff.mean()).view(model.cfg.n_layers, n_cells)


def test_atp_equals_exact_when_linear(planted):
    model, batch = planted
    with _frozen_final_norm(model):
        atp = attribution_patching(model, batch)
        exact = patch_layer_head(model, batch)
        delta = exact["logit_diff"] - exact.baseline.clean_logit_diff.mean()
        # every head's z reaches the logits linearly (other heads' outputs are zero, no MLPs)
        assert delta[PLANTED_LAYER, PLANTED_HEAD].abs() > 0.1
        assert torch.allclose(atp.z, delta, atol=1e-4, rtol=1e-4)
        # residual positions entering the last layer: also linear
        from vlens.patching import patch_layer_position

        positions = patch_layer_position(model, batch, layers=[model.cfg.n_layers - 1])
        pos_delta = positions["logit_diff"][0] - positions.baseline.clean_logit_diff.mean()
        assert torch.allclose(atp.resid_pre[-1], pos_delta, atol=1e-4, rtol=1e-4)


def test_atp_star_recomputes_the_softmax(planted):
    model, batch = planted
    with _frozen_final_norm(model):
        star = attribution_patching(model, batch, qk_fix=True)
        plain = attribution_patching(model, batch, qk_fix=False)
        exact_q = _exact_delta(model, batch, "q", model.cfg.n_heads)
        exact_k = _exact_delta(model, batch, "k", model.cfg.n_key_value_heads)
    # downstream of the pattern everything is linear, so AtP* is exact for queries and keys ...
    assert exact_q[PLANTED_LAYER, PLANTED_HEAD].abs() > 1e-3
    assert torch.allclose(star.q, exact_q, atol=1e-4, rtol=1e-3)
    assert torch.allclose(star.k, exact_k, atol=1e-4, rtol=1e-3)
    # ... while the gradient through the (sharp) softmax misses
    cell = (PLANTED_LAYER, PLANTED_HEAD)
    assert abs(plain.q[cell] - exact_q[cell]) > 10 * abs(star.q[cell] - exact_q[cell]) + 1e-4


def test_spearman_by_hand():
    assert spearman(torch.tensor([1.0, 2, 3, 4]), torch.tensor([10.0, 20, 30, 40])) == pytest.approx(1.0)
    assert spearman(torch.tensor([1.0, 2, 3, 4]), torch.tensor([4.0, 3, 2, 1])) == pytest.approx(-1.0)
    # ranks x = (1,2,3), y = (1,3,2): 1 - 6*2/(3*8) = 0.5
    assert spearman(torch.tensor([1.0, 2, 3]), torch.tensor([1.0, 3, 2])) == pytest.approx(0.5)
    # ties take average ranks: x ranks (1, 2.5, 2.5, 4), y (1, 2, 3, 4): 4.5 / sqrt(4.5 * 5)
    assert spearman(torch.tensor([1.0, 2, 2, 3]), torch.tensor([1.0, 2, 3, 4])) == pytest.approx(4.5 / 22.5**0.5)
    assert math.isnan(spearman(torch.ones(4), torch.tensor([1.0, 2, 3, 4])))  # nothing to rank
    with pytest.raises(ValueError):
        spearman(torch.zeros(3), torch.zeros(4))


def test_atp_json(planted):
    model, batch = planted
    result = attribution_patching(model, batch)
    result.exact_z = result.z.clone()
    data = result.to_dict()
    assert data["mode"] == "atp" and data["spearman_z_vs_exact"] == pytest.approx(1.0)
    assert len(data["z"]) == model.cfg.n_layers and len(data["resid_pre"][0]) == batch.seq_len
    assert result.plot().data[0].z.shape == (model.cfg.n_layers, model.cfg.n_heads)

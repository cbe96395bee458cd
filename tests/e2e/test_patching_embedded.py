"""Patching on the embedded trained model (slow: run with -m slow; skipped without its weights)."""

from __future__ import annotations

import pytest
import torch

from vlens import SweepOptions
from vlens.patching import (
    attribution_patching,
    build_pair_batch,
    make_count_pairs,
    patch_layer_head,
    patch_layer_position,
    patch_layer_region,
)

pytestmark = pytest.mark.slow
torch.set_num_threads(1)


@pytest.fixture(scope="module")
def embedded():
    import vlens

    model = vlens.load()
    return model, build_pair_batch(model, make_count_pairs(4, seed=3))  # at the model's own size


@pytest.mark.parametrize("sweep", [patch_layer_region, patch_layer_position, patch_layer_head])
def test_fast_equals_naive_on_the_embedded_model(embedded, sweep):
    model, batch = embedded
    fast, naive = sweep(model, batch), sweep(model, batch, options=SweepOptions(implementation="naive"))
    assert torch.allclose(fast.per_pair_logit_diff, naive.per_pair_logit_diff, atol=1e-5)
    assert torch.equal(fast.per_pair_prediction, naive.per_pair_prediction)


def test_all_region_patch_reproduces_the_corrupt_run(embedded):
    model, batch = embedded
    result = patch_layer_region(model, batch, regions=["all"])
    corrupt = result.baseline.corrupt_logit_diff
    assert torch.allclose(result.per_pair_logit_diff[:, 0], corrupt.expand(model.cfg.n_layers, -1), atol=1e-4)


def test_atp_ranks_heads_like_the_exact_sweep(embedded):
    model, batch = embedded
    exact = patch_layer_head(model, batch)
    atp = attribution_patching(model, batch)
    atp.exact_z = exact["logit_diff"] - exact.baseline.clean_logit_diff.mean()
    assert atp.spearman_z > 0.5

"""Patching sweeps with a metric callable and a readout position (TransformerLens style), by
known answers: a hand-written logit difference equals the default metric's, a readout before a
patched position cannot move, pair chunks and the fast path give the same numbers."""

from __future__ import annotations

import pytest
import torch

from tests.helpers.models import tiny_vlm
from vlens import SweepOptions
from vlens.data import make_pair
from vlens.patching import attribution_patching, build_pair_batch, patch_layer_head, patch_layer_region
from vlens.utils.errors import UserInputError

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def tiny():
    return tiny_vlm("qwen2_5_vl", n_layers=2, d_model=32, n_heads=4, n_kv_heads=2)


@pytest.fixture(scope="module")
def batch(tiny):
    pairs = [make_pair(2, 3, seed=0, size=56), make_pair(4, 2, seed=1, size=84), make_pair(1, 2, seed=2, size=56)]
    return build_pair_batch(tiny, pairs)


def _logit_diff(batch):
    def logit_diff(logits, rows):  # corrupt minus clean answer at the (single) readout position
        picked = logits[:, -1]
        rows = rows.tolist()
        return picked[range(len(rows)), batch.corrupt_tokens[rows]] - picked[range(len(rows)), batch.clean_tokens[rows]]

    return logit_diff


def test_a_hand_written_logit_difference_equals_the_default_metric(tiny, batch):
    default = patch_layer_head(tiny, batch, region="image")
    mine = patch_layer_head(tiny, batch, region="image", metric=_logit_diff(batch))
    assert mine.metric == "logit_diff" and list(mine.metrics) == ["logit_diff"] and mine.baseline is None
    torch.testing.assert_close(mine["logit_diff"], default["logit_diff"], atol=1e-6, rtol=0)
    torch.testing.assert_close(mine.per_pair["logit_diff"], default.per_pair_logit_diff, atol=1e-6, rtol=0)
    # the unpatched runs' values are kept as the baseline
    torch.testing.assert_close(mine.baseline_values["logit_diff"]["clean"], default.baseline.clean_logit_diff,
                               atol=1e-6, rtol=0)
    data = mine.to_dict()
    assert data["metric"] == "logit_diff" and len(data["logit_diff"]) == tiny.cfg.n_layers


def test_pair_chunks_pass_the_rows_and_give_the_same_values(tiny, batch):
    whole = patch_layer_head(tiny, batch, metric=_logit_diff(batch))
    chunked = patch_layer_head(tiny, batch, metric=_logit_diff(batch), options=SweepOptions(batch_size=2))
    torch.testing.assert_close(chunked["logit_diff"], whole["logit_diff"], atol=1e-5, rtol=0)
    with pytest.raises(UserInputError, match="rows"):  # a closure over the whole batch would be wrong here
        patch_layer_head(tiny, batch, metric=lambda logits: logits[:, -1, 0], options=SweepOptions(batch_size=2))


def test_dict_and_scalar_metrics(tiny, batch):
    both = patch_layer_region(tiny, batch, regions=("image", "final"),
                              metric=lambda logits: {"top": logits[:, -1].max(-1).values, "mean": logits.mean()})
    assert set(both.metrics) == {"top", "mean"} and both["mean"].shape == (tiny.cfg.n_layers, 2)
    assert set(both.per_pair) == {"top"}  # a scalar has no per-pair values
    with pytest.raises(UserInputError, match="one number per batch"):
        patch_layer_region(tiny, batch, metric=lambda logits, rows: logits.mean(),
                           options=SweepOptions(batch_size=2), regions=("image",))
    with pytest.raises(UserInputError, match="shape"):
        patch_layer_region(tiny, batch, metric=lambda logits: logits[:, -1], regions=("image",))


def test_a_readout_before_the_patch_cannot_move(tiny, batch):
    """Causal attention: patching the final position changes nothing at the column before it."""
    first = lambda logits: logits[:, 0, 5]  # noqa: E731  (logit of token 5 at the first readout column)
    result = patch_layer_region(tiny, batch, regions=("final",), options=SweepOptions(readout=[-2, -1]), metric=first)
    clean = result.baseline_values["metric"]["clean"]
    assert result.readout == [-2, -1]
    torch.testing.assert_close(result.per_pair["metric"][:, 0], clean.expand(tiny.cfg.n_layers, -1),
                               atol=1e-6, rtol=0)  # equal up to the fast path's float noise
    last = lambda logits: logits[:, 1, 5]  # noqa: E731
    moved = patch_layer_region(tiny, batch, regions=("final",), options=SweepOptions(readout=[-2, -1]), metric=last)
    # at layer 1 the final position already holds what it read from the image: patching it moves the logits
    assert not torch.allclose(moved.per_pair["metric"][-1, 0], moved.baseline_values["metric"]["clean"], atol=1e-4)


def test_fast_equals_naive_at_several_readout_positions(tiny, batch):
    read = lambda logits: logits[:, :, :7].sum((1, 2))  # noqa: E731
    fast = patch_layer_head(tiny, batch, metric=read, options=SweepOptions(readout=[-3, -1], max_batch=5))
    naive = patch_layer_head(tiny, batch, metric=read, options=SweepOptions(readout=[-3, -1], implementation="naive"))
    torch.testing.assert_close(fast.per_pair["metric"], naive.per_pair["metric"], atol=1e-4, rtol=1e-5)


def test_readout_errors_are_clear(tiny, batch):
    with pytest.raises(UserInputError, match="final position"):
        patch_layer_head(tiny, batch, options=SweepOptions(readout=-2))  # the default answer metrics read the final position
    with pytest.raises(UserInputError, match="outside"):
        patch_layer_head(tiny, batch, metric=lambda logits: logits[:, 0, 0],
                         options=SweepOptions(readout=[batch.seq_len]))
    with pytest.raises(UserInputError, match="padding"):  # column 0 is padding for the shorter pairs
        patch_layer_head(tiny, batch, metric=lambda logits: logits[:, 0, 0], options=SweepOptions(readout=0))


def test_attribution_patching_with_a_metric(tiny, batch):
    default = attribution_patching(tiny, batch)
    mine = attribution_patching(tiny, batch, metric=_logit_diff(batch))
    assert mine.metric == "logit_diff"
    torch.testing.assert_close(mine.z, default.z, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(mine.clean_logit_diff, default.clean_logit_diff, atol=1e-6, rtol=0)

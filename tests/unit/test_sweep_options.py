"""`vlens.SweepOptions`: one options object for every sweep, checked when built; the old keywords
still work (with a DeprecationWarning naming the new spelling) and give the same numbers; a
readout a method cannot honour is refused; the cache device leaves the numbers unchanged."""

from __future__ import annotations

import pytest
import torch

import vlens
from tests.helpers.models import tiny_vlm
from vlens import SweepOptions, UserInputError
from vlens.ablation import AblationSettings
from vlens.evaluation import EvalSettings
from vlens.lens.translators import LensTraining
from vlens.patching import attribution_patching, build_pair_batch, make_count_pairs, patch_layer_head
from vlens.patching.fast import FastPlan
from vlens.patching.sweeps import patch_layer_region

QUIET = SweepOptions(progress=False)


@pytest.fixture(scope="module")
def model():
    return tiny_vlm("qwen2_5_vl")


@pytest.fixture(scope="module")
def batch(model):
    return build_pair_batch(model, make_count_pairs(4, seed=3, size=56))


def test_options_are_frozen_checked_and_shared():
    options = SweepOptions(batch_size=4, readout=[-2, -1], cache_device="cpu")
    assert options.readout == (-2, -1) and options.cache_device == torch.device("cpu")
    with pytest.raises(AttributeError):
        options.batch_size = 8  # type: ignore[misc]
    assert options.replace(progress=False).progress is False and options.progress is True
    assert options.batch(16) == 4 and SweepOptions().batch(16) == 16
    assert vlens.SweepOptions is SweepOptions and vlens.parallel.SweepOptions is SweepOptions
    for bad, match in [({"batch_size": 0}, "batch_size must be an integer >= 1"),
                       ({"max_batch": 1.5}, "max_batch"), ({"heads_per_pass": True}, "heads_per_pass"),
                       ({"readout": "first"}, "readout must be 'final'"), ({"readout": []}, "readout"),
                       ({"progress": "yes"}, "progress"), ({"sharding": 2}, "Sharding"),
                       ({"cache_device": "gpu7"}, "not a torch device")]:
        with pytest.raises(UserInputError, match=match):
            SweepOptions(**bad)
    with pytest.raises(UserInputError, match="no field batchsize"):
        options.replace(batchsize=2)
    assert options.settings()["readout"] == [-2, -1] and options.settings()["world_size"] == 1


def test_old_keywords_warn_and_give_the_same_numbers(model, batch):
    new = patch_layer_head(model, batch, options=QUIET.replace(batch_size=2, max_batch=8))
    with pytest.warns(DeprecationWarning, match=r"pair_batch_size= -> SweepOptions\(batch_size=...\)"):
        old = patch_layer_head(model, batch, pair_batch_size=2, max_batch=8, progress=False)
    assert torch.equal(new.per_pair_logit_diff, old.per_pair_logit_diff)
    # attribution_patching(batch_size=) meant pairs per chunk: it is the same field now
    with pytest.warns(DeprecationWarning, match="attribution_patching"):
        chunked = attribution_patching(model, batch, batch_size=2)
    assert torch.equal(chunked.z, attribution_patching(model, batch, options=QUIET.replace(batch_size=2)).z)
    with pytest.raises(UserInputError, match="not both"), pytest.warns(DeprecationWarning):
        patch_layer_head(model, batch, options=QUIET, max_batch=8)
    with pytest.raises(TypeError, match="unexpected keyword argument 'heads_per_pass'"):
        patch_layer_head(model, batch, heads_per_pass=2)
    with pytest.raises(UserInputError, match="options must be a vlens.SweepOptions"):
        patch_layer_head(model, batch, options={"progress": False})  # type: ignore[arg-type]


def test_method_settings_objects_take_the_old_keywords_too():
    from vlens.ablation.settings import split_legacy

    with pytest.warns(DeprecationWarning, match=r"top_k= moved into settings=AblationSettings"):
        settings, rest = split_legacy(None, {"top_k": 3, "progress": False}, "cross_task_ablation")
    assert settings == AblationSettings(top_k=3) and rest == {"progress": False}
    with pytest.raises(UserInputError, match="method must be one of"):
        AblationSettings(method="mean-ish")
    with pytest.raises(UserInputError, match="top_k must be an integer >= 1"):
        AblationSettings(top_k=0)
    with pytest.raises(UserInputError, match="max_new_tokens"):
        EvalSettings(max_new_tokens=0)
    with pytest.raises(UserInputError, match="lr"):
        LensTraining(lr=0.0)


def test_a_readout_the_method_cannot_honour_is_refused(model):
    from vlens.lens.logit_lens import logit_lens_records

    records = [{"question": "How many dots are there?", "answer": "1", "image": None}]
    with pytest.raises(UserInputError, match="SweepOptions.readout must be 'final'"):
        logit_lens_records(model, records, options=SweepOptions(readout=-2))


def test_readout_columns_reach_the_metric(model, batch):
    """options.readout picks the column the metric reads: reading the final column by index
    equals reading "final" (the pairs are left-padded: -1 is every row's final position)."""
    token = int(batch.clean_tokens[0])

    def metric(logits):
        return logits[:, 0, token]

    final = patch_layer_region(model, batch, regions=("image",), metric=metric, options=QUIET)
    by_column = patch_layer_region(model, batch, regions=("image",), metric=metric,
                                   options=QUIET.replace(readout=-1))
    torch.testing.assert_close(final["metric"], by_column["metric"], atol=1e-6, rtol=0)
    assert by_column.readout == [-1]


def test_cache_device_keeps_the_cache_there_and_the_numbers(model, batch):
    """The plan's cached activations live on cache_device; the sweep's numbers are unchanged (on a
    GPU machine the same check moves them off the GPU: benchmarks/device_checks.py)."""
    specs = patch_layer_head(model, batch, options=QUIET)
    kept = patch_layer_head(model, batch, options=QUIET.replace(cache_device="cpu"))
    assert torch.equal(specs.per_pair_logit_diff, kept.per_pair_logit_diff)
    from vlens.patching.conditions import PatchSpec

    plan = FastPlan(model, batch, [PatchSpec(1, "z", batch.region_mask("all"), head=0)], cache_device="cpu")
    assert {r.device.type for r in plan.resids} == {"cpu"} and plan.resid_devices[0] == model.input_device

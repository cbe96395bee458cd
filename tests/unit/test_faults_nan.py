"""Fault family "NaN activations": one NaN weight must give NaN results and a warning naming the
layer and positions, never ranks, rates, tokens or classes computed from NaN."""

from __future__ import annotations

import json

import pytest
import torch

from tests.helpers.models import tiny_pair
from vlens import HookedVLM
from vlens.testing import random_image
from vlens.utils.finite import NonFiniteWarning, collect_non_finite, json_safe, locate_non_finite

NAN_LAYER = 1


def nan_model() -> HookedVLM:
    """A tiny model whose layer-1 MLP has one NaN weight: resid_post of layer 1 onwards is NaN."""
    hf, model = tiny_pair("qwen2_5_vl", fresh=True, n_layers=3, d_model=32, n_heads=4, n_kv_heads=2)
    with torch.no_grad():
        hf.model.language_model.layers[NAN_LAYER].mlp.down_proj.weight[0, 0] = float("nan")
    return model


@pytest.fixture(scope="module")
def model():
    return nan_model()


@pytest.fixture(scope="module")
def inputs(model):
    return model.prepare(images=[random_image(56, 56, 0), random_image(56, 56, 1)],
                         prompts=["How many dots are there?", "How many dots are there?"])


def test_locate_names_the_first_non_finite_hook_and_positions(model, inputs):
    where = locate_non_finite(model, inputs)
    assert where.startswith(f"blocks.{NAN_LAYER}.mlp.hook_post") or where.startswith(f"blocks.{NAN_LAYER}.hook_mlp_out")
    assert "NaN at (0, " in where


def test_logit_lens_gives_nan_not_rank_one(model, inputs):
    from vlens.lens.logit_lens import logit_lens

    answers = torch.tensor([model.to_single_token("3"), model.to_single_token("4")])
    with pytest.warns(NonFiniteWarning, match=rf"logit lens.*\(layer, example\) \({NAN_LAYER}, 0\).*blocks\.{NAN_LAYER}"):
        result = logit_lens(model, inputs, answers)
    assert not result.non_finite[:NAN_LAYER].any() and result.non_finite[NAN_LAYER:].all()
    assert result.median_rank[NAN_LAYER:].isnan().all() and result.top1_accuracy[NAN_LAYER:].isnan().all()
    assert result.mean_probability[NAN_LAYER:].isnan().all()
    assert (result.top_tokens[NAN_LAYER:] == -1).all()
    data = json.loads(json.dumps(result.to_dict(), allow_nan=False))
    assert data["median_rank"][NAN_LAYER] is None and data["top_tokens"][NAN_LAYER][0] is None
    assert data["median_rank"][0] is not None


def test_patching_rates_are_nan(model):
    from vlens.patching import build_pair_batch, make_count_pairs, patch_layer_region

    batch = build_pair_batch(model, make_count_pairs(2, seed=0, size=56))
    with pytest.warns(NonFiniteWarning, match=r"patching.*unpatched clean run.*First non-finite activation"):
        result = patch_layer_region(model, batch, regions=("image", "all"))
    for name in ("overwrite_rate", "flip_away_rate", "corrupt_answer_rate", "logit_diff", "patch_effect"):
        assert result.metrics[name].isnan().all(), name
    assert (result.per_pair_prediction == -1).all()
    data = json.loads(json.dumps(result.to_dict(), allow_nan=False))
    assert data["overwrite_rate"][0][0] is None and data["baseline"]["finite"] == [False, False]


def test_attribution_patching_warns(model):
    from vlens.patching import build_pair_batch, make_count_pairs
    from vlens.patching.attribution import attribution_patching

    batch = build_pair_batch(model, make_count_pairs(2, seed=0, size=56))
    with collect_non_finite() as problems, pytest.warns(NonFiniteWarning, match="attribution patching"):
        result = attribution_patching(model, batch)
    assert problems and result.clean_logit_diff.isnan().all()
    json.dumps(result.to_dict(), allow_nan=False)


def test_json_safe():
    assert json_safe({"a": [1.0, float("nan"), float("inf")], "b": torch.tensor([float("-inf"), 2.0])}) == \
        {"a": [1.0, None, None], "b": [None, 2.0]}


def test_ablation_gives_nan_and_valid_json(model, tmp_path):
    from vlens import SweepOptions
    from vlens.ablation import AblationSettings, build_task_batch, cross_task_ablation

    sets = {task: (build_task_batch(model, task, 2, image_size=56),
                   build_task_batch(model, task, 2, image_size=56, reference=True))
            for task in ("counting", "counting@synreal")}
    with pytest.warns(NonFiniteWarning, match=r"ablation \(counting\).*unablated run.*First non-finite"):
        report = cross_task_ablation(model, sets, AblationSettings(top_k=3),
                                     options=SweepOptions(batch_size=2, progress=False))
    matrix, _ = report.jaccard()
    assert matrix.isnan().all()  # never 1.00 from two empty or arbitrary head sets
    result = report.results["counting"]
    assert not result.finite and result.top_heads(3) == []
    data = json.loads(report.save(tmp_path / "ablation.json").read_text())
    assert data["results"]["counting"]["clean_logprob"] is None and data["jaccard"]["matrix"][0][1] is None
    assert "No head could be measured" in report.html_report().to_html()  # the report is written, not a crash


def test_headlens_heads_are_non_finite_not_classified(model):
    from vlens import SweepOptions
    from vlens.lens.corpus import task_samples
    from vlens.lens.head_scores import compute_head_scores
    from vlens.lens.taxonomy import classify_heads

    with pytest.warns(NonFiniteWarning, match="HeadLens"):
        scores = compute_head_scores(model, task_samples(2, seed=0, size=56), k=3,
                                     options=SweepOptions(batch_size=2, progress=False))
    taxonomy = classify_heads(scores)
    n_heads = model.cfg.n_heads
    assert scores.non_finite[NAN_LAYER:].all() and not scores.non_finite[:NAN_LAYER].any()
    assert all(taxonomy.classes[(NAN_LAYER, h)] == "non-finite" for h in range(n_heads))
    assert all(scores.head(NAN_LAYER, h)[name] is None for h in range(n_heads) for name in scores.scores)
    assert taxonomy.counts()["non-finite"] == (model.cfg.n_layers - NAN_LAYER) * n_heads


def test_generation_and_evaluation_never_parse_nan_answers(model, tmp_path):
    from tests.helpers.eval_data import write_imagefolder
    from vlens import SweepOptions
    from vlens.evaluation import EvalSettings, HookedVLMBackend, evaluate, read_counting_imagefolder

    data = read_counting_imagefolder(write_imagefolder(tmp_path / "data", [1, 2, 3]))
    with pytest.warns(NonFiniteWarning, match=r"generate.*rows \[0, 1\].*First non-finite activation"):
        result = evaluate(HookedVLMBackend(model), data, EvalSettings(max_new_tokens=2),
                          options=SweepOptions(batch_size=2, progress=False))
    assert all(p.parsed is None and not p.correct and p.extra["non_finite"] for p in result.predictions)
    assert result.settings["n_non_finite"] == 3

"""`vlens study object-tokens` and `vlens study flow` on the embedded model at a toy size: the results
load back, the reports state each claim's verdict from the numbers, and study flags are owned."""

from __future__ import annotations

import argparse

import pytest
import torch

import vlens
from tests.helpers.results import without_provenance
from vlens.cli import build_parser, main
from vlens.cli.study import DEFAULTS, OBJECT_TASK_NAMES, OWNERS
from vlens.flow.batch import TASK_NAMES
from vlens.studies.flow import FlowSettings, FlowStudy, run_flow_study
from vlens.studies.object_tokens import ALPHA, ObjectTokenSettings, ObjectTokenStudy, run_object_token_study
from vlens.utils.errors import UserInputError

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def model():
    return vlens.load()


def test_object_token_study_loads_back_and_states_its_verdicts(model, tmp_path):
    result = run_object_token_study(model, ObjectTokenSettings(tasks=("colour",), n=4, sites=("vision", "2")),
                                    model_name="tiny", progress=False)
    assert [(run["task"], run["site"]) for run in result.runs] == [("colour", "vision"), ("colour", 2)]
    for run in result.runs:
        ablation = result.ablation(run["task"], run["site"])
        claim = run["claim"]
        assert claim["object_drop"] == ablation.accuracy_drop("object")
        supported = claim["object_drop"] > claim["random_drop"] and claim["p"] < ALPHA
        assert claim["verdict"] == ("supported" if supported else "not supported")
    result.save(tmp_path)
    loaded = vlens.load_result(tmp_path)
    assert isinstance(loaded, ObjectTokenStudy) and without_provenance(loaded.to_dict()) == result.to_dict()
    assert "| colour | vision |" in result.report()
    result.plot()


def test_flow_study_loads_back_and_locates_each_edge(model, tmp_path):
    result = run_flow_study(model, FlowSettings(tasks=("colour",), n=4, edges=("image->final", "object->final")),
                            model_name="tiny", progress=False)
    assert result.settings["window"] == 1  # max(1, 4 // 4)
    sweep = result.sweep("colour")
    for edge, finding in result.findings["colour"].items():
        means = sweep.summary[edge]["prob"]["mean"]
        assert finding["mean"] == min(means)
        assert finding["verdict"] == ("matters" if finding["high"] < 0 else "no effect shown")
    result.save(tmp_path)
    loaded = vlens.load_result(tmp_path)
    assert isinstance(loaded, FlowStudy) and without_provenance(loaded.to_dict()) == result.to_dict()
    result.plot()


def test_settings_are_checked():
    with pytest.raises(UserInputError, match="task"):
        FlowSettings(tasks=("count",))
    with pytest.raises(UserInputError, match="site"):
        ObjectTokenSettings(sites=("decoder",))


def test_study_flags_belong_to_one_study(tmp_path, capsys):
    parser = build_parser(["study"])
    study = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices["study"]
    assert {name: study.get_default(name) for name in DEFAULTS} == DEFAULTS
    assert set(OWNERS) == set(DEFAULTS)
    assert OBJECT_TASK_NAMES == TASK_NAMES
    assert main(["study", "flow", "--lora-rank", "2", "--out", str(tmp_path / "x")]) == 2
    assert "--lora-rank do not apply to `vlens study flow`" in capsys.readouterr().err

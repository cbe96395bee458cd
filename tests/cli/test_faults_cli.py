"""Fault families at the command line: a NaN model gives null results and exit 3 (0 with
--allow-nan), a bad value is one line with exit 2 before any model loads."""

from __future__ import annotations

import argparse
import json
import math
import re
import shutil

import pytest
import torch

from tests.helpers.faults import run_cli
from vlens.data import make_task_sample, write_imagefolder
from vlens.testing import tiny_hf_model, tiny_qwen_processor
from vlens.utils.finite import NonFiniteWarning


def test_nan_model_logit_lens_exits_3_unless_allowed(tmp_path, capsys):
    hf = tiny_hf_model("qwen2_5_vl")
    with torch.no_grad():
        hf.model.language_model.layers[1].mlp.down_proj.weight[0, 0] = float("nan")
    hf.save_pretrained(tmp_path / "nan_model")
    tiny_qwen_processor().save_pretrained(tmp_path / "nan_model")
    write_imagefolder([make_task_sample("counting", seed=i, size=56) for i in range(2)], tmp_path / "data")
    argv = ["logit-lens", "--model", str(tmp_path / "nan_model"), "--data", str(tmp_path / "data"),
            "--out", str(tmp_path / "out"), "--quiet"]
    with pytest.warns(NonFiniteWarning, match=r"First non-finite activation: blocks\.1\."):
        code, err = run_cli(argv, capsys)
    assert code == 3 and "--allow-nan" in err
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert results["median_rank"][0] is not None and results["median_rank"][-1] is None
    with pytest.warns(NonFiniteWarning):
        assert run_cli([*argv, "--allow-nan", "--overwrite"], capsys)[0] == 0


def test_bad_values_fail_while_parsing(tmp_path, capsys):
    for argv, flag in ((["logit-lens", "--make", "2", "--limit", "-2"], "--limit"),
                       (["logit-lens", "--make", "2", "--image-size", "0"], "--image-size"),
                       (["train", "--data", str(tmp_path), "--max-steps", "0"], "--max-steps"),
                       (["train", "--data", str(tmp_path), "--focus-weight", "nan"], "--focus-weight")):
        code, err = run_cli([*argv, "--out", str(tmp_path / "o")], capsys)
        assert code == 2 and f"argument {flag}: must be" in err, (argv, err)
        assert not (tmp_path / "o").exists()


def test_temperature_fit_on_an_unusable_result_is_one_line(tmp_path, capsys):
    report = {"results": {"counting": {}, "colour": {}}}
    (tmp_path / "report.json").write_text(json.dumps(report))
    (tmp_path / "other.json").write_text('{"hello": 1}')
    (tmp_path / "broken.json").write_bytes(b"\xff not json")
    for name, message in (("report.json", r"tasks \['counting', 'colour'\]: pass task=\.\.\. \(--task"),
                          ("other.json", "other.json: unrecognised importance result"),
                          ("broken.json", "broken.json: not a JSON result file"),
                          ("missing.json", "missing.json: no such file or folder")):
        code, err = run_cli(["temperature", "fit", "--result", str(tmp_path / name), "--out", str(tmp_path / "t")],
                            capsys)
        assert code == 2 and re.search(message, err) and "Traceback" not in err, (name, err)


def _options(parser, path=("vlens",)):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _options(sub, (*path, name))
        elif action.option_strings and action.type is not None:
            yield " ".join((*path, action.option_strings[-1])), action.type


def test_every_numeric_flag_is_checked_while_parsing():
    """No flag of any command reads a bare int/float (a negative count becomes a Python slice, a
    seed of -1 a late traceback) and none accepts nan or inf."""
    from vlens.cli import build_parser

    loose = []
    for flag, parse in _options(build_parser()):
        if parse in (int, float):
            loose.append(f"{flag}: type={parse.__name__}")
            continue
        for text in ("nan", "inf", "-inf"):
            try:
                value = parse(text)
            except (argparse.ArgumentTypeError, ValueError, TypeError):
                continue
            if isinstance(value, float) and not math.isfinite(value):
                loose.append(f"{flag} accepts {text}")
    assert not loose, loose


def test_temperature_fit_top_k_beyond_the_scored_heads_is_refused(tmp_path, capsys):
    (tmp_path / "scores.json").write_text(json.dumps({"scores": [[1.0, 2.0], [3.0, 4.0]]}))
    code, err = run_cli(["temperature", "fit", "--result", str(tmp_path / "scores.json"), "--top-k", "5",
                         "--out", str(tmp_path / "t")], capsys)
    assert code == 2 and "--top-k must be an integer in [1, 4], got 5" in err, err
    assert not (tmp_path / "t" / "results.json").exists()


def test_zoo_evaluate_refuses_a_folder_missing_a_tensor_and_writes_nothing(tmp_path, capsys):
    from safetensors.torch import load_file, save_file

    from vlens.zoo import WEIGHTS_FOLDER

    folder = tmp_path / "model"
    shutil.copytree(WEIGHTS_FOLDER, folder)
    tensors = load_file(folder / "model.safetensors")
    del tensors["model.layers.0.mlp.up_proj.weight"]
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    for extra in ([], ["--write"]):  # evaluating random weights, then writing their card, is the silent case
        code, err = run_cli(["zoo", "evaluate", "--model", str(folder), "--held-out", "1", *extra], capsys)
        assert code == 2 and "layers.0.mlp.up_proj.weight" in err and "Traceback" not in err, err
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before


def test_ablate_with_an_unknown_patching_metric_fails_before_the_sweep(tmp_path, capsys):
    (tmp_path / "patching.json").write_text(json.dumps({"patch_effect": [[0.1] * 4] * 3}))
    code, err = run_cli(["ablate", "--patching", str(tmp_path / "patching.json"), "--patching-metric", "nope",
                         "--tasks", "counting,colour", "--top-k", "2", "--n-examples", "2", "--n-reference", "2",
                         "--out", str(tmp_path / "o"), "--quiet"], capsys)
    assert code == 2 and "no head scores under nope" in err and "keys: ['patch_effect']" in err, err
    assert not (tmp_path / "o" / "results.json").exists()


def test_study_top_k_heads_beyond_the_model_names_the_flag_before_training(tmp_path, capsys):
    code, err = run_cli(["study", "--model", "random-tiny", "--top-k-heads", "1000", "--n-train", "1", "--n-eval", "1",
                         "--out", str(tmp_path / "o"), "--quiet"], capsys)
    assert code == 2 and "--top-k-heads must be an integer in [1, " in err and "got 1000" in err, err
    assert not (tmp_path / "o" / "seed0").exists()


def test_study_model_card_path_is_checked_before_the_study(tmp_path, capsys):
    (tmp_path / "card").mkdir()
    code, err = run_cli(["study", "--model", "random-tiny", "--model-card", str(tmp_path / "card"), "--n-train", "1",
                         "--n-eval", "1", "--out", str(tmp_path / "o"), "--quiet"], capsys)
    assert code == 2 and "--model-card" in err and "is a folder" in err, err
    assert not (tmp_path / "o" / "seed0").exists()

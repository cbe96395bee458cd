"""`vlens lens train` and `vlens headlens` end to end on the random tiny model."""

from __future__ import annotations

import json

import pytest
import torch

from vlens.cli import main
from vlens.data import make_task_sample, write_imagefolder
from vlens.lens.taxonomy import HEAD_CLASSES

torch.set_num_threads(1)
COMMON = ["--model", "random-tiny", "--image-size", "56", "--batch-size", "4", "--quiet"]


def test_lens_train_then_headlens_on_an_imagefolder(tmp_path, capsys):
    assert main(["lens", "train", "--make", "8", "--steps", "10", "--out", str(tmp_path / "lens"), *COMMON]) == 0
    assert "KL before" in capsys.readouterr().out
    config = json.loads((tmp_path / "lens" / "config.json").read_text())
    assert len(config["training"]["kl_before"]) == config["n_layers"] == 2
    data = write_imagefolder([make_task_sample(task, seed=i, size=56) for i, task in
                              enumerate(["counting", "colour", "existence", "spatial", "counting"])], tmp_path / "data")
    out = tmp_path / "run"
    assert main(["headlens", "--data", str(data), "--lens", str(tmp_path / "lens"), "--out", str(out), *COMMON]) == 0
    result = json.loads((out / "results.json").read_text())
    assert result["n_examples"] == 5 and len(result["heads"]) == 2 * 4
    head = result["heads"][5]
    assert (head["layer"], head["head"]) == (1, 1)
    assert head["class"] in HEAD_CLASSES and set(head["scores"]) >= {"vgs", "cter", "image_attention"}
    assert len(head["top_tokens"]) > 0
    assert sum(result["counts"].values()) == 8
    # image attention relative to the image-token share; every class with its stability over resampled examples
    assert 0 < result["image_share"] < 1 and "image_attention_ratio" in head["scores"]
    assert 0 <= head["stability"] <= 1 and isinstance(head["stable"], bool)
    assert result["stability"]["n_resamples"] == 200 and set(result["counts_interval"]) == set(result["counts"])
    assert (out / "taxonomy.md").read_text().startswith("| class | head |")
    assert (out / "taxonomy.html").is_file()


def test_headlens_trains_its_lens_when_none_is_given(tmp_path, capsys):
    out = tmp_path / "run"
    only_grounding = tmp_path / "thresholds.json"  # every other rule unreachable, grounding always true
    only_grounding.write_text(json.dumps({"existence_min": 1, "difficulty_min": 1, "alignment_min": 1,
                                          "routing_image_ratio_min": 100, "routing_cter_min": 1, "grounding_vgs_min": 0,
                                          "chance_corrected": False}))
    args = ["headlens", "--make", "6", "--tasks", "counting", "--lens-make", "6", "--lens-steps", "10", "--out", str(out),
            "--thresholds", str(only_grounding), *COMMON]
    assert main(args) == 0
    assert json.loads((out / "results.json").read_text())["counts"]["visual grounding"] == 8
    printed = capsys.readouterr().out
    assert "KL before" in printed and "classes:" in printed
    kl = json.loads((out / "lens_kl.json").read_text())
    assert len(kl["kl_before"]) == len(kl["kl_after"]) == 2
    assert (out / "lens" / "translators.safetensors").is_file()


def test_cli_errors_are_explained(tmp_path, capsys):
    bad = tmp_path / "thresholds.json"
    bad.write_text('{"vgs": 0.5}')
    assert main(["headlens", "--make", "2", "--thresholds", str(bad), "--out", str(tmp_path / "out"), *COMMON]) == 2
    assert "unknown thresholds ['vgs']" in capsys.readouterr().err
    assert main(["headlens", "--make", "2", "--lens", str(tmp_path / "missing"), "--out", str(tmp_path / "out"), *COMMON]) == 2
    assert "missing: no such file or folder" in capsys.readouterr().err  # checked before the model loads
    (tmp_path / "empty").mkdir()
    assert main(["headlens", "--make", "2", "--lens", str(tmp_path / "empty"), "--out", str(tmp_path / "out"), *COMMON]) == 2
    assert "holds no config.json" in capsys.readouterr().err
    with pytest.raises(SystemExit) as stop:  # refused while the command line is read, before the model loads
        main(["lens", "train", "--make", "2", "--tasks", "counting,juggling", "--out", str(tmp_path / "lens"), *COMMON])
    assert stop.value.code == 2 and "unknown task(s) 'juggling'" in capsys.readouterr().err
    assert not (tmp_path / "lens").exists()

"""`vlens sae train` and `vlens sae dashboard` end to end on the random tiny model."""

from __future__ import annotations

import json

import torch

from vlens.cli import main
from vlens.sae import load_sae

torch.set_num_threads(1)
COMMON = ["--model", "random-tiny", "--image-size", "56", "--prompts-per-forward", "4", "--quiet"]
HOOK = "blocks.1.hook_resid_post"


def test_train_then_dashboard(tmp_path, capsys):
    out = tmp_path / "sae"
    assert main(["sae", "train", "--hook", HOOK, "--positions", "all", "--make", "8", "--d-sae", "32", "--k", "4",
                 "--tokens", "512", "--batch-tokens", "64", "--buffer", "256", "--evaluate", "4",
                 "--out", str(out), *COMMON]) == 0
    printed = capsys.readouterr().out
    assert "spliced at image" in printed and "explained variance" in printed
    sae = load_sae(out)
    assert sae.cfg.hook_name == HOOK and sae.cfg.d_sae == 32 and sae.cfg.architecture == "topk"
    result = json.loads((out / "results.json").read_text())
    assert result["metrics"]["steps"] == 8 and "provenance" in result
    assert [row["positions"] for row in result["evaluation"]["rows"]] == ["image", "text", "all"]
    dash = tmp_path / "dash"
    assert main(["sae", "dashboard", "--sae", str(out), "--make", "6", "--features", "0,1,2", "--top-k", "3",
                 "--out", str(dash), *COMMON]) == 0
    page = (dash / "dashboard.html").read_text()
    assert "feature 0" in page and "<script" not in page and "http" not in page
    views = json.loads((dash / "results.json").read_text())
    assert [f["feature"] for f in views["features"]] == [0, 1, 2]
    evaluation = tmp_path / "eval"
    assert main(["sae", "evaluate", "--sae", str(out), "--make", "4", "--positions", "image,final",
                 "--out", str(evaluation), *COMMON]) == 0
    rows = json.loads((evaluation / "results.json").read_text())["rows"]
    assert [row["positions"] for row in rows] == ["image", "final"] and rows[0]["n"] == 4
    # the same command again refuses to replace results
    assert main(["sae", "train", "--hook", HOOK, "--make", "4", "--out", str(out), *COMMON]) == 2


def test_bad_flags_are_one_line_errors(tmp_path, capsys):
    not_sae = tmp_path / "not_sae"  # a folder beside --out (an --out inside an input is its own error)
    not_sae.mkdir()
    for argv, expected in [
        (["sae", "train", "--hook", "blocks.1.hook_resid_postt", "--make", "2"], "hook"),
        (["sae", "train", "--hook", HOOK, "--make", "2", "--positions", "text", "--cells", "0,0"], "--cells"),
        (["sae", "train", "--hook", HOOK, "--make", "2", "--buffer", "10", "--batch-tokens", "8"], "--buffer"),
        (["sae", "dashboard", "--sae", str(not_sae), "--make", "2"], "not an SAE folder"),
    ]:
        assert main([*argv, "--out", str(tmp_path / "o"), *COMMON]) == 2, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and expected in err[0], err

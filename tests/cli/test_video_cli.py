"""Video pairs from the command line: `vlens patch --video-frames N --mode layer-frame`, `vlens circuit
--video-frames N` (frame-cell nodes), and the clear errors around them."""

from __future__ import annotations

import json

import pytest

import vlens
from vlens.cli import main

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # random models: differences within the noise floor

COMMON = ["--model", "random-tiny", "--make-pairs", "2", "--video-frames", "4", "--image-size", "56", "--quiet"]


def test_patch_layer_frame_writes_a_result_that_loads_back(tmp_path):
    out = tmp_path / "frames"
    assert main(["patch", *COMMON, "--mode", "layer-frame", "--out", str(out)]) == 0
    data = json.loads((out / "results.json").read_text())
    assert data["mode"] == "layer-region" and data["regions"] == ["f0", "f1"] and data["n_pairs"] == 2
    loaded = vlens.load_result(out)
    assert loaded.cells == ["f0", "f1"] and loaded.to_dict()["logit_diff"] == data["logit_diff"]
    assert (out / "figure.html").exists()


def test_circuit_on_video_pairs_names_frame_cells(tmp_path):
    out = tmp_path / "circuit"
    assert main(["circuit", *COMMON, "--method", "eap", "--top-k", "3", "--out", str(out)]) == 0
    assert "img0.f1[r1,c1]" in (out / "results.json").read_text()


def test_video_flags_are_checked_before_the_model_loads(tmp_path, capsys):
    assert main(["patch", "--model", "random-tiny", "--make-pairs", "2", "--mode", "layer-frame",
                 "--out", str(tmp_path / "a"), "--quiet"]) == 2
    assert "--video-frames" in capsys.readouterr().err
    (tmp_path / "pairs").mkdir()
    assert main(["patch", "--model", "random-tiny", "--pairs", str(tmp_path / "pairs"), "--video-frames", "2",
                 "--mode", "layer-region", "--out", str(tmp_path / "b"), "--quiet"]) == 2
    assert "--make-pairs" in capsys.readouterr().err

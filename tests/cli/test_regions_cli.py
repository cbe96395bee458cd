"""`vlens info --image PATH --box ...`: the tokens a box covers through the model's preprocessing, one
line each, the same as `inputs.regions.from_box`, and the figure as an HTML file."""

from __future__ import annotations

import pytest

from vlens.cli import main
from vlens.testing import random_image


def test_info_lists_the_tokens_a_box_covers(tmp_path, capsys):
    pytest.importorskip("plotly")
    path = tmp_path / "wide.png"
    random_image(150, 70, 2).save(path)
    figure = tmp_path / "regions.html"
    argv = ["info", "--model", "random-tiny", "--image", str(path), "--box", "10", "10", "80", "60",
            "--figure", str(figure)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    from vlens.zoo.specs import load_model

    model = load_model("random-tiny")
    inputs = model.prepare(images=[random_image(150, 70, 2)], prompts=["Describe the image."])
    selection = inputs.regions.from_box(0, (10, 10, 80, 60))
    assert f"{len(selection)} tokens of" in out
    for label, cover in zip(selection.labels, selection.coverage.tolist(), strict=True):
        assert f"{label} (position" in out and f"coverage {cover:.3f}" in out
    assert figure.read_text().count("<script") >= 1


def test_info_box_needs_an_image_and_a_valid_box(tmp_path, capsys):
    path = tmp_path / "a.png"
    random_image(40, 30, 1).save(path)
    assert main(["info", "--model", "random-tiny", "--box", "0", "0", "5", "5"]) == 2
    assert "--image and --box go together" in capsys.readouterr().err
    assert main(["info", "--model", "random-tiny", "--image", str(path), "--box", "0", "0", "50", "5"]) == 2
    assert "outside the 40 x 30 image" in capsys.readouterr().err

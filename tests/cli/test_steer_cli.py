"""vlens steer: each direction source runs end to end and its folder loads back."""

from __future__ import annotations

import torch

from vlens import load_result
from vlens.cli import main
from vlens.steering import SteeringResult
from vlens.testing import random_image


def test_steer_from_means_and_from_a_saved_direction(tmp_path, capsys):
    image = tmp_path / "img.png"
    random_image(56, 56, 1).save(image)
    out = tmp_path / "means"
    assert main(["steer", "--model", "random-tiny", "--prompt", "How many dots are there?", "--prompt", "red",
                 "--image", str(image), "--positive", "red", "yes", "--negative", "no", "--layers", "0,1",
                 "--strengths", "0,3", "--max-new-tokens", "2", "--out", str(out), "--quiet"]) == 0
    result = load_result(out)
    assert isinstance(result, SteeringResult) and result.tokens[0] == result.plain_tokens
    assert result.settings["layers"] == [0, 1] and (out / "steering.html").is_file()
    assert "strength 3" in capsys.readouterr().out
    torch.save(torch.ones(64), tmp_path / "d.pt")
    out2 = tmp_path / "saved"
    assert main(["steer", "--model", "random-tiny", "--prompt", "red", "--direction", str(tmp_path / "d.pt"),
                 "--region", "none", "--from-step", "1", "--strengths", "1", "--max-new-tokens", "3",
                 "--out", str(out2), "--quiet"]) == 0
    loaded = load_result(out2)
    assert loaded.settings["prompt_region"] is None and loaded.tokens[0][0][:2] == loaded.plain_tokens[0][:2]


def test_steer_user_errors(tmp_path, capsys):
    torch.save(torch.ones(5), tmp_path / "d.pt")
    assert main(["steer", "--model", "random-tiny", "--prompt", "red", "--direction", str(tmp_path / "d.pt"),
                 "--out", str(tmp_path / "o")]) == 2
    assert "d_model" in capsys.readouterr().err
    assert main(["steer", "--model", "random-tiny", "--prompt", "red", "--positive", "red",
                 "--out", str(tmp_path / "o2")]) == 2
    assert "--negative" in capsys.readouterr().err

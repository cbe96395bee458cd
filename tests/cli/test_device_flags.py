"""Commands that load a model honour --device cpu --dtype bfloat16 (info, patch, logit-lens here).

They run on the real-vocabulary folder (Qwen's 151k BPE, "12" is "1", "2") and their results
list each answer's tokens.
`vlens.specs.load_model` is wrapped to record what each command actually built.
"""

from __future__ import annotations

import json

import pytest
import torch

import vlens.specs
from vlens.cli import main
from vlens.real_vocab import real_vocab_folder

BF16 = ["--device", "cpu", "--dtype", "bfloat16", "--quiet"]


@pytest.fixture(scope="module")
def real():
    return str(real_vocab_folder("qwen2.5-vl-7b", tiny=True, n_layers=2, vision_depth=1, max_pixels=56 * 56))


@pytest.fixture
def loaded(monkeypatch):
    """The (device, dtype, image grid size) of every model a command loads."""
    seen = []
    original = vlens.specs.load_model

    def recording(*args, **kwargs):
        model = original(*args, **kwargs)
        seen.append((str(model.W_U.device), model.W_U.dtype))
        return model

    monkeypatch.setattr(vlens.specs, "load_model", recording)
    return seen


def run(argv, loaded):
    assert main([*argv, *BF16]) == 0
    assert loaded and all(entry == ("cpu", torch.bfloat16) for entry in loaded), loaded
    loaded.clear()


@pytest.fixture(scope="module")
def counting_data(tmp_path_factory):
    folder = tmp_path_factory.mktemp("data") / "counting"
    assert main(["data", "syndot", "--n", "3", "--image-size", "56", "--out", str(folder), "--quiet"]) == 0
    return folder


def test_scoring_commands_on_the_real_vocabulary(real, loaded, tmp_path, counting_data):
    run(["info", "--model", real], loaded)
    run(["patch", "--model", real, "--make-pairs", "2", "--image-size", "56", "--mode", "layer-region",
         "--out", str(tmp_path / "patch")], loaded)
    answers = json.loads((tmp_path / "patch" / "results.json").read_text())["answers"]
    assert all(isinstance(t, list) for t in answers["clean_answer_tokens"])
    run(["logit-lens", "--model", real, "--data", str(counting_data), "--out", str(tmp_path / "ll")], loaded)
    lens = json.loads((tmp_path / "ll" / "results.json").read_text())
    assert all(isinstance(t, list) and t for t in lens["answer_tokens"])

"""Commands that load a model honour --device cpu --dtype bfloat16: info, patch, logit-lens, ablate,
temperature fit/apply, eval, lens train, headlens, train, and demo (slow).

They run on the real-vocabulary folder (Qwen's 151k BPE, "12" is "1", "2") at the smallest
settings, and their results list each answer's tokens.
`vlens.zoo.specs.load_model` is wrapped to record what each command actually built (results.json
does not record the dtype).
"""

from __future__ import annotations

import json

import pytest
import torch

import vlens.demo.pipeline
import vlens.zoo.specs
from vlens.cli import main
from vlens.testing.real_vocab import real_vocab_folder

BF16 = ["--device", "cpu", "--dtype", "bfloat16", "--quiet"]


@pytest.fixture(scope="module")
def real():
    return str(real_vocab_folder("qwen2.5-vl-7b", tiny=True, n_layers=2, vision_depth=1, max_pixels=56 * 56))


@pytest.fixture
def loaded(monkeypatch):
    """The (device, dtype, image grid size) of every model a command loads."""
    seen = []
    original = vlens.zoo.specs.load_model

    def recording(*args, **kwargs):
        model = original(*args, **kwargs)
        seen.append((str(model.W_U.device), model.W_U.dtype))
        return model

    monkeypatch.setattr(vlens.zoo.specs, "load_model", recording)
    monkeypatch.setattr(vlens.demo.pipeline, "load_model", recording)  # imported by name there
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


def jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_ablation_and_temperature_commands_in_bf16(real, loaded, tmp_path, counting_data):
    run(["ablate", "--model", real, "--tasks", "counting", "--n-examples", "2", "--n-reference", "2",
         "--top-k", "2", "--image-size", "56", "--out", str(tmp_path / "ablate")], loaded)
    ablation = json.loads((tmp_path / "ablate" / "results.json").read_text())
    tokens = ablation["results"]["counting"]["answer_tokens"]
    assert len(tokens) == 2 and all(isinstance(t, list) and t for t in tokens)
    # fit loads no model; it reads the ablation folder
    assert main(["temperature", "fit", "--result", str(tmp_path / "ablate"), "--top-k", "2",
                 "--out", str(tmp_path / "fit"), "--quiet"]) == 0
    run(["temperature", "apply", "--model", real, "--temps", str(tmp_path / "fit"), "--data", str(counting_data),
         "--limit", "2", "--max-new-tokens", "2", "--out", str(tmp_path / "apply")], loaded)
    for condition in ("with_temperature", "without_temperature"):
        rows = jsonl(tmp_path / "apply" / condition / "predictions.jsonl")
        assert len(rows) == 2 and all(isinstance(row["target_tokens"], list) for row in rows)


def test_eval_in_bf16(real, loaded, tmp_path, counting_data):
    run(["eval", "--model", real, "--data", str(counting_data), "--limit", "2", "--max-new-tokens", "2",
         "--out", str(tmp_path / "eval")], loaded)
    rows = jsonl(tmp_path / "eval" / "predictions.jsonl")
    assert len(rows) == 2 and all(isinstance(row["target_tokens"], list) and row["target_tokens"] for row in rows)
    assert json.loads((tmp_path / "eval" / "results.json").read_text())


def test_lens_train_and_headlens_in_bf16(real, loaded, tmp_path):
    run(["lens", "train", "--model", real, "--make", "3", "--steps", "2", "--image-size", "56",
         "--out", str(tmp_path / "lens")], loaded)
    assert (tmp_path / "lens" / "translators.safetensors").exists()
    run(["headlens", "--model", real, "--make", "2", "--lens", str(tmp_path / "lens"), "--k", "3",
         "--image-size", "56", "--out", str(tmp_path / "headlens")], loaded)
    taxonomy = json.loads((tmp_path / "headlens" / "results.json").read_text())
    assert taxonomy["d_vocab"] == 152064 and len(taxonomy["heads"]) == 8
    assert all(isinstance(head["top_tokens"], list) and head["top_tokens"] for head in taxonomy["heads"])


def test_train_in_bf16(real, loaded, tmp_path, counting_data):
    run(["train", "--model", real, "--data", str(counting_data), "--limit", "2", "--max-steps", "1",
         "--lora-rank", "2", "--out", str(tmp_path / "train")], loaded)
    result = json.loads((tmp_path / "train" / "sft_result.json").read_text())
    assert result["steps"] == 1 and result["final_sft_loss"] > 0


@pytest.mark.slow  # ~4.5 min on 2 shared cores (HeadLens and counting evaluation at a 152k vocabulary)
def test_demo_in_bf16(real, loaded, tmp_path):
    run(["demo", "--model", real, "--quick", "--out", str(tmp_path / "demo")], loaded)
    demo = json.loads((tmp_path / "demo" / "results.json").read_text())
    assert demo["model"]["d_vocab"] == 152064
    tokens = demo["sections"]["logit_lens"]["data"]["answer_tokens"]
    assert tokens and all(isinstance(t, list) and t for t in tokens)

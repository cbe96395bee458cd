"""--device-map / --max-memory / --offload-folder reach `from_pretrained` (HF/accelerate placement of one
model), give the same results as --device cpu, and wrong combinations are explained.

On a CPU-only machine the placements are "cpu" everywhere (`--device-map cpu`, or "auto" with an ample
budget) and disk offload ("auto" under a small budget).
"""

from __future__ import annotations

import argparse
import copy
import json

import accelerate  # noqa: F401  (the dev extra installs it: device_map needs it)
import pytest

import vlens.core.loading
import vlens.core.model
from vlens.cli import main
from vlens.cli.options import device_map_arg, max_memory_arg
from vlens.testing import tiny_hf_model, tiny_qwen_processor


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny-checkpoint")
    tiny_hf_model("qwen2_5_vl", n_layers=2, seed=3).save_pretrained(folder)
    tiny_qwen_processor().save_pretrained(str(folder))
    return str(folder)


@pytest.fixture(scope="module")
def counting_data(tmp_path_factory):
    folder = tmp_path_factory.mktemp("data") / "counting"
    assert main(["data", "syndot", "--n", "2", "--image-size", "56", "--out", str(folder), "--quiet"]) == 0
    return str(folder)


@pytest.fixture
def placements(monkeypatch):
    """Per model a command loads: (the placement keywords HF's loader received, the HF device map).
    transformers sets ``hf_device_map`` only when a map spreads the model (e.g. cpu + disk)."""
    seen = []
    original = vlens.core.model.load_hf_model_and_processor

    def recording(*args, **kwargs):
        # copied first: HF converts max_memory's sizes to bytes in place
        given = {key: copy.deepcopy(kwargs[key]) for key in ("device_map", "max_memory", "offload_folder")
                 if key in kwargs}
        hf_model, processor = original(*args, **kwargs)
        seen.append((given, getattr(hf_model, "hf_device_map", None)))
        return hf_model, processor

    monkeypatch.setattr(vlens.core.model, "load_hf_model_and_processor", recording)
    return seen


def lens_results(folder):
    results = json.loads((folder / "results.json").read_text())
    return {key: results[key] for key in ("probabilities", "ranks", "answer_tokens")}


def test_device_map_runs_give_the_single_device_results(checkpoint, counting_data, placements, tmp_path):
    def logit_lens(name, *flags):
        argv = ["logit-lens", "--model", checkpoint, "--data", counting_data, "--out", str(tmp_path / name), "--quiet"]
        assert main([*argv, *flags]) == 0
        return lens_results(tmp_path / name)

    reference = logit_lens("one", "--device", "cpu")
    assert placements.pop() == ({}, None)
    assert logit_lens("cpu-map", "--device-map", "cpu") == reference
    assert placements.pop() == ({"device_map": "cpu"}, None)
    assert logit_lens("auto", "--device-map", "auto", "--max-memory", "cpu=4GiB") == reference
    assert placements.pop() == ({"device_map": "auto", "max_memory": {"cpu": "4GiB"}}, None)
    # a budget smaller than the model: accelerate keeps some modules on disk, in --offload-folder
    offload = str(tmp_path / "offload")
    assert logit_lens("disk", "--device-map", "auto", "--max-memory", "cpu=400000", "--offload-folder", offload) \
        == reference
    given, placed = placements.pop()
    assert given == {"device_map": "auto", "max_memory": {"cpu": 400000}, "offload_folder": offload}
    assert set(map(str, placed.values())) == {"cpu", "disk"}


@pytest.mark.parametrize("flags,message", [
    (["--device", "cpu", "--device-map", "auto"], "give one of them"),
    (["--max-memory", "cpu=1GiB"], "add --device-map auto"),
])
def test_placement_flags_that_clash_are_explained(checkpoint, flags, message, capsys):
    assert main(["info", "--model", checkpoint, *flags]) == 2
    assert message in capsys.readouterr().err


def test_device_map_of_the_embedded_model_is_refused(capsys):
    assert main(["info", "--model", "random-tiny", "--device-map", "cpu"]) == 2
    assert "only for a model folder or hub id" in capsys.readouterr().err


def test_parsing_of_maps_and_budgets(tmp_path):
    assert device_map_arg(" auto ") == "auto"
    assert device_map_arg('{"model.visual": 0, "lm_head": "cpu"}') == {"model.visual": 0, "lm_head": "cpu"}
    (tmp_path / "map.json").write_text('{"": "cpu"}')
    assert device_map_arg(str(tmp_path / "map.json")) == {"": "cpu"}
    assert max_memory_arg("0=70GiB, 1=70GiB,cpu=200GiB,disk=1000") == {0: "70GiB", 1: "70GiB", "cpu": "200GiB",
                                                                      "disk": 1000}
    for bad in ["", '{"a": [1]}', "{not json", str(tmp_path / "missing.json"), "[]"]:
        with pytest.raises(argparse.ArgumentTypeError):
            device_map_arg(bad)
    for bad in ["70GiB", "gpu0=1GiB", "0=1GiB,0=2GiB", "cpu="]:
        with pytest.raises(argparse.ArgumentTypeError):
            max_memory_arg(bad)


def test_eval_with_the_plain_hf_backend_takes_the_device_map(checkpoint, counting_data, tmp_path, monkeypatch):
    given, original = [], vlens.core.loading.from_pretrained_checked

    def recording(*args, **kwargs):
        given.append({key: copy.deepcopy(kwargs[key]) for key in ("device_map", "max_memory") if key in kwargs})
        return original(*args, **kwargs)

    monkeypatch.setattr(vlens.core.loading, "from_pretrained_checked", recording)
    outputs = []
    for name, flags in (("one", ["--device", "cpu"]), ("auto", ["--device-map", "auto", "--max-memory", "cpu=4GiB"])):
        argv = ["eval", "--model", checkpoint, "--backend", "hf", "--data", counting_data, "--max-new-tokens", "3",
                "--out", str(tmp_path / name), "--quiet", *flags]
        assert main(argv) == 0
        outputs.append([json.loads(line)["output"] for line in (tmp_path / name / "predictions.jsonl").open()])
    assert outputs[0] == outputs[1] and len(outputs[0]) == 2
    assert given == [{}, {"device_map": "auto", "max_memory": {"cpu": "4GiB"}}]

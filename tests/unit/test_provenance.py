"""Provenance of results: the weights digest, the run a command records, and what every save adds."""

from __future__ import annotations

import json

import torch
from torch import nn

from vlens.utils.provenance import (
    current_run,
    note_model,
    note_run,
    provenance,
    recorded_model_spec,
    run_context,
    same_weights,
    seeds_of,
    stamp,
    weights_digest,
    weights_fingerprint,
)
from vlens.utils.results import Result


def _net(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(64, 300), nn.LayerNorm(300), nn.Linear(300, 5))


def test_weights_digest_follows_the_weights_not_the_device_or_copy():
    a, b = _net(0), _net(0)
    assert weights_digest(a) == weights_digest(b) == weights_digest(_net(0))
    assert weights_digest(_net(1)) != weights_digest(a)
    with torch.no_grad():
        b[0].weight.mul_(1.001)  # a fine-tuning-like change of every weight of one layer
    assert weights_digest(b) != weights_digest(a)
    assert weights_digest(a.to(torch.bfloat16)) != weights_digest(_net(0))  # another dtype is other weights
    meta = nn.Linear(8, 8, device="meta")
    assert len(weights_digest(meta)) == 16  # offloaded tensors: names, dtypes and shapes only
    assert same_weights({"weights_fingerprint": weights_fingerprint(_net(0))}, _net(0)) is True
    assert same_weights({"model": {"weights_digest": weights_digest(_net(0))}}, _net(1)) is False
    assert same_weights({}, _net(0)) is None


def test_a_command_records_its_line_seeds_world_size_and_models():
    with run_context(["patch", "--model", "tiny", "--seed", "3"], command="patch"):
        note_run(seeds_of({"seed": 3, "retest_seed": None, "seeds": [0, 1], "steps": 5, "flag": True}), world_size=2)
        first, second = _net(0), _net(1)
        note_model(first, "tiny")
        note_model(second)
        note_model(first)  # noted again (e.g. after a cast): one entry, spec kept
        record = provenance()
    assert record["command_line"] == "vlens patch --model tiny --seed 3" and record["command"] == "patch"
    assert record["seeds"] == {"seed": 3, "retest_seed": None, "seeds": [0, 1]} and record["world_size"] == 2
    assert [m["spec"] for m in record["models"]] == ["tiny", None] and record["model"]["spec"] is None
    assert record["model"]["n_parameters"] == sum(p.numel() for p in second.parameters())
    assert record["started_at"] <= record["written_at"]
    assert current_run().command is None  # the command's record ends with it


def test_every_saved_result_carries_provenance_and_keeps_a_stored_one(tmp_path):
    class Tiny(Result):
        def __init__(self, extra=None):
            self.extra = extra or {}

        def to_dict(self):
            return {"value": 1, **self.extra}

        def plot(self):
            return None

    with run_context(["ablate", "--top-k", "2"], command="ablate"):
        path = Tiny().save(tmp_path / "a")
    saved = json.loads(path.read_text())
    assert saved["value"] == 1 and saved["provenance"]["command"] == "ablate"
    stored = {"written_at": "2026-01-01T00:00:00Z", "git_commit": "abc"}
    again = json.loads(Tiny({"provenance": stored}).save(tmp_path / "b.json").read_text())
    assert again["provenance"] == stored  # a result made earlier says when it was made, not when copied
    assert stamp({"x": 1})["provenance"]["command_line"].startswith("python")  # outside the command line


def test_a_loaded_result_is_its_file_and_model_folders_are_absolute(tmp_path, monkeypatch):
    class Kept(Result):
        kind = "test_kept_provenance"

        def __init__(self, value=1):
            self.value = value

        def to_dict(self):
            return {"value": self.value}

        @classmethod
        def from_dict(cls, data):
            return cls(data["value"])

        def plot(self):
            return None

    (tmp_path / "my-model").mkdir()
    monkeypatch.chdir(tmp_path)
    with run_context(["ablate", "--model", "my-model"], command="ablate"):
        note_model(_net(0), "my-model")
        path = Kept(3).save(tmp_path / "out")
    saved = json.loads(path.read_text())
    assert saved["provenance"]["model"]["spec"] == str(tmp_path / "my-model")  # absolute: readable from anywhere
    loaded = Kept.load(tmp_path / "out")
    assert loaded.to_dict() == saved and loaded.saved_provenance == saved["provenance"]  # the file, key for key
    assert json.loads(loaded.save(tmp_path / "again").read_text()) == saved  # re-saved: the same record
    assert recorded_model_spec("Qwen/Qwen2.5-VL-7B-Instruct") == "Qwen/Qwen2.5-VL-7B-Instruct"  # a hub id stays
    assert recorded_model_spec("tiny") == "tiny" and recorded_model_spec(None) is None

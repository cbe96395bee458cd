"""A loaded result's `to_dict()` is the file it was read from, its `provenance` block included (before: the
block was left out, kept only as `saved_provenance`), for every result kind (one real saved file each, made
by tests/helpers/saved_results.py); saving it again writes that provenance once, unchanged."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

import vlens
from tests.helpers.results import without_provenance
from vlens.lens.translators import Translators
from vlens.utils.finite import json_safe
from vlens.utils.results import BUILTIN_KINDS, result_file

SAVED = Path(__file__).parent / "saved_results"
FILES = sorted(folder for folder in SAVED.iterdir() if folder.is_dir())  # <kind>/results.json (+ weights, ...)
# how a result was made, as `vlens.utils.provenance.stamp` writes it (fixed here: the test compares it key for key)
PROVENANCE = {
    "vlens_version": "0.1.0", "git_commit": "04f402e", "command_line": "vlens patch --model 'my model' --seed 3",
    "command": "patch", "started_at": "2026-12-02T10:41:07Z", "written_at": "2026-12-02T10:41:19Z",
    "seeds": {"seed": 3, "retest_seed": None}, "world_size": 2, "torch_version": "2.13.0+cpu",
    "transformers_version": "5.24.0", "python_version": "3.11.7",
    "model": {"spec": "/models/my model", "architecture": "Qwen2_5_VLForConditionalGeneration", "dtype": "float32",
              "device": ["cpu", "meta"], "n_parameters": 1534592, "weights_digest": "0123456789abcdef",
              "weights_digest_method": "sha256 over ..."},
}


def _strict(data: dict) -> dict:
    """`data` after the strict JSON round trip a writer makes (NaN / inf as null)."""
    return json.loads(json.dumps(json_safe(data), allow_nan=False))


def _stamped(data, top: bool = True):
    """`data` with a provenance block in it and in every result nested in it (a dict whose "kind" is a result
    kind: a circuit's edge scores, the temperatures `vlens temperature apply` compared)."""
    if isinstance(data, list):
        return [_stamped(value, False) for value in data]
    if not isinstance(data, dict):
        return data
    out = {key: _stamped(value, False) for key, value in data.items()}
    if top or data.get("kind") in BUILTIN_KINDS:
        out["provenance"] = {**PROVENANCE, "command": "nested"} if not top else PROVENANCE
    return out


def _stamped_copy(folder: Path, target: Path) -> dict:
    """The saved file of `folder` (with its side files) at `target`, with provenance blocks; returns the file's dict."""
    shutil.copytree(folder, target)
    data = _strict(_stamped(json.loads((folder / "results.json").read_text())))
    (target / "results.json").write_text(json.dumps(data, indent=1, allow_nan=False) + "\n")
    return data


def test_every_kind_but_the_lens_has_a_saved_file():
    assert {f.name for f in FILES} == set(BUILTIN_KINDS) - {"lens"}  # the lens: its own test below


@pytest.mark.parametrize("file", FILES, ids=lambda f: f.name)
def test_a_loaded_result_is_its_file_and_saves_its_provenance_once(file, tmp_path):
    data = _stamped_copy(file, tmp_path / "result")
    loaded = vlens.load_result(tmp_path / "result")
    # exactly: every key, the provenance block too (a writer that gained a key: run tests/helpers/saved_results.py)
    assert _strict(loaded.to_dict()) == data
    assert loaded.saved_provenance == PROVENANCE
    again = json.loads(result_file(loaded.save(tmp_path / "again")).read_text())  # a study: its folder
    assert again == data and again["provenance"] == PROVENANCE  # not stamped anew, not nested
    assert "provenance" not in json.dumps(again["provenance"])
    assert vlens.load_result(file).saved_provenance is None  # the file as kept here records none


def test_a_new_result_has_no_provenance_until_saved(tmp_path):
    loaded = vlens.load_result(SAVED / "patching")
    fresh = type(loaded).from_dict(without_provenance(loaded.to_dict()))  # never saved: nothing says how it was made
    assert "provenance" not in fresh.to_dict() and fresh.saved_provenance is None
    saved = json.loads(fresh.save(tmp_path).read_text())
    assert saved["provenance"]["vlens_version"] is not None  # stamped when written
    assert vlens.load_result(tmp_path).to_dict() == saved


def test_a_loaded_lens_is_its_config_file(tmp_path):
    lens = Translators(2, 3, {"model": "random-tiny", "training": {"kl": [0.5, None]}})
    with torch.no_grad():
        lens.A.normal_(generator=torch.Generator().manual_seed(0))
    assert "provenance" not in lens.to_dict()
    lens.save(tmp_path / "lens")
    config = json.loads((tmp_path / "lens" / "config.json").read_text())
    loaded = vlens.load_result(tmp_path / "lens")
    assert isinstance(loaded, Translators) and loaded.to_dict() == config and config["provenance"]["vlens_version"]
    loaded.save(tmp_path / "again")
    assert json.loads((tmp_path / "again" / "config.json").read_text()) == config  # the same provenance, once

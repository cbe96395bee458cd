"""How `vlens.load_result` names the field a reader failed on, for any result kind (a plugin's too): the key the
failing expression read (`failing_paths`, a path into the file: 'nodes[1].layer'), a JSON value no saved form of
the field's annotation can be (`json_misfit`), a required argument the class was built without, the field the
object is checked on before its methods use it; and a list or tensor whose named size disagrees with most
other fields' is the one named (before: whichever field was read first)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import pytest
import torch
from jaxtyping import Float
from torch import Tensor

import vlens
from vlens.utils.results import Result, read_checked, result_class
from vlens.utils.saved_fields import failing_paths, json_misfit

SAVED = Path(__file__).parent / "saved_results"


def _node(entry: dict) -> tuple[int, str]:
    return int(entry["layer"]), str(entry["name"])  # a helper the traceback does not tie to a key of the file


@dataclass
class _Planted(Result):
    """A result kind written the way a plugin would: its reader converts the file's values in a helper."""

    nodes: list
    scale: float
    labels: list[str]
    values: Float[Tensor, "n_items"]
    weights: Float[Tensor, "n_items"]
    extra: Float[Tensor, "n_items"]

    kind: ClassVar[str] = "planted_fields_test"
    saved_dims: ClassVar[dict[str, str]] = {"labels": "n_items"}

    def to_dict(self) -> dict:
        return {"nodes": [{"layer": layer, "name": name} for layer, name in self.nodes], "scale": self.scale,
                "labels": list(self.labels), "values": self.values.tolist(), "weights": self.weights.tolist(),
                "extra": self.extra.tolist(), "scaled": [self.scale * v for v in self.values.tolist()]}

    @classmethod
    def from_dict(cls, data: dict) -> _Planted:
        return cls(nodes=[_node(entry) for entry in data["nodes"]], scale=data["scale"], labels=list(data["labels"]),
                   values=torch.tensor(data["values"]), weights=torch.tensor(data["weights"]),
                   extra=torch.tensor(data["extra"]))

    def plot(self):  # pragma: no cover - not drawn here
        return None


GOOD = {"kind": "planted_fields_test", "nodes": [{"layer": 0, "name": "a"}, {"layer": 1, "name": "b"}],
        "scale": 2.0, "labels": ["p", "q", "r"], "values": [1.0, 2.0, 3.0], "weights": [0.5, 0.5, 0.5],
        "extra": [0.0, 0.0, 0.0], "scaled": [2.0, 4.0, 6.0]}


def _message(tmp_path: Path, data: dict) -> str:
    (tmp_path / "results.json").write_text(json.dumps(data))
    with pytest.raises(vlens.UserInputError) as caught:
        vlens.load_result(tmp_path)
    message = str(caught.value)
    assert "results.json" in message and "\n" not in message, message
    return message


def test_the_planted_kind_loads_back(tmp_path):
    (tmp_path / "results.json").write_text(json.dumps(GOOD))
    assert vlens.load_result(tmp_path).to_dict() == GOOD


def test_a_value_inside_a_list_of_records_is_named_by_its_path(tmp_path):
    nodes = [GOOD["nodes"][0], {"layer": "one", "name": "b"}]
    assert "the field 'nodes[1].layer' does not fit" in _message(tmp_path, {**GOOD, "nodes": nodes})
    nodes = [GOOD["nodes"][0], {"name": "b"}]
    assert "the field 'nodes[1].layer' is missing" in _message(tmp_path, {**GOOD, "nodes": nodes})


def test_a_value_the_methods_would_trip_over_is_named_before_they_run(tmp_path):
    # to_dict multiplies by the scale: the field is checked against its annotation first
    assert "the field 'scale' must be a number, got str 'big'" in _message(tmp_path, {**GOOD, "scale": "big"})


def test_a_missing_field_is_named(tmp_path):
    assert "the field 'weights' is missing" in _message(tmp_path, {k: v for k, v in GOOD.items() if k != "weights"})


def test_the_list_or_tensor_that_disagrees_with_most_fields_is_named(tmp_path):
    # the labels are checked first and bind n_items = 2: the values, read next, are not the odd ones out
    message = _message(tmp_path, {**GOOD, "labels": ["p", "q"]})
    assert "the field 'labels' holds 2 entries, which disagrees with the other fields' n_items (3)" in message
    message = _message(tmp_path, {**GOOD, "extra": [0.0, 0.0]})  # the last tensor: named as before
    assert "the field 'extra' must be a floating-point tensor of shape [n_items]" in message


def test_two_lists_read_together_are_both_named(tmp_path):
    # zip(top_token_ids, top_tokens, strict=True) of a saved logit lens: either may be the short one
    data = json.loads((SAVED / "logit_lens" / "results.json").read_text())
    message = _message(tmp_path, {**data, "top_tokens": data["top_tokens"][:-1]})
    assert "the field 'top_token_ids' or 'top_tokens'" in message, message


def test_failing_paths_reads_keys_through_copies_and_tables():
    data = {"mode": "a", "rows": [{"x": 1}]}
    table = {"a": "cells"}

    def reader(saved: dict) -> None:
        copy = dict(saved)
        copy[table[copy["mode"]]]  # noqa: B018 - the read that fails

    with pytest.raises(KeyError) as caught:
        reader(data)
    assert failing_paths(caught.value, data) == ["cells"]


def test_json_misfit_never_flags_a_saved_file():
    """The annotation check only names a field when a reader already failed; on every real saved file it finds
    nothing (a field whose saved form its annotation does not describe would be named wrongly)."""
    for folder in sorted(p for p in SAVED.iterdir() if p.is_dir()):
        data = json.loads((folder / "results.json").read_text())
        cls = result_class(data["kind"])
        assert json_misfit(cls, data) is None, folder.name


def test_read_checked_names_a_field_for_the_class_reader_too(tmp_path):
    with pytest.raises(vlens.UserInputError, match="the field 'nodes\\[0\\]' does not fit"):
        read_checked(_Planted, {**GOOD, "nodes": ["seven", GOOD["nodes"][1]]}, tmp_path / "results.json")

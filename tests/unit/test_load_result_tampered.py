"""`vlens.load_result` on tampered files: for every result kind (one real saved file each, made by
tests/helpers/saved_results.py), a missing field, a field of another type, a null where no NaN can be and a
list of the wrong length (every entry of each class's `saved_dims`) are each a `UserInputError` naming the file
and the field, never a traceback or a silently different result (before: KeyError / TypeError tracebacks, or the
tampered value kept)."""

from __future__ import annotations

import copy
import dataclasses
import json
import shutil
from pathlib import Path

import pytest

import vlens
from vlens.utils.results import BUILTIN_KINDS, read_checked, result_class
from vlens.utils.saved_fields import first_difference

SAVED = Path(__file__).parent / "saved_results"
FILES = sorted(folder for folder in SAVED.iterdir() if folder.is_dir())  # <kind>/results.json (+ weights, ...)
# kinds without a saved file here, and why
NOT_COVERED = {
    "lens": "a lens folder (config.json + safetensors), read by Translators.load, not a results file",
}
# (kind, key) where a value of another type is refused (UserInputError naming the file) but the message does not
# name the field: none left. The field is found by one mechanism for every kind (vlens.utils.results.read_checked):
# the key the failing expression read, a value of the file a local there holds, a JSON value no saved form of the
# field's annotation can be, or the field the class checks before its methods use it
UNNAMED: set[tuple[str, str]] = set()


def _own_keys(data: dict, loaded) -> list[str]:
    """The keys the result reads itself (not the extras a command wrote beside it, nor a free-form `extra` dict)."""
    free = set(loaded.extras) | set(getattr(loaded, "extra", None) or {})
    return [key for key in data if key != "kind" and key not in free]


def _names(message: str, key: str, loaded, data: dict) -> bool:
    """The message names `key` (or a part of it: 'nodes[3].layer'), or the field of the result it is read into (a
    dataclass field that is no key of the file: the evaluation's `model` is its `model_name`); never another key."""
    fields = [f.name for f in dataclasses.fields(loaded)] if dataclasses.is_dataclass(loaded) else []
    return any(f"'{name}'" in message or f"'{name}." in message or f"'{name}[" in message
               for name in [key, *(f for f in fields if f not in data)]) and "the field" in message


def _other_type(value):
    """A JSON value of another type than `value`."""
    if isinstance(value, bool):
        return "yes"
    if isinstance(value, (int, float)):
        return "x"
    if isinstance(value, str):
        return 7
    if isinstance(value, list):
        return "x"
    if isinstance(value, dict):
        return ["x"]
    return "x"  # null


def _saved(folder: Path) -> dict:
    return json.loads((folder / "results.json").read_text())


def _load(tmp_path: Path, data: dict, folder: Path | None = None):
    """load_result of `data` as results.json, beside the other files of the saved `folder` (weights, ...): copied
    once per test (no reader writes them; copying them for each of a test's ~20 loads was most of its time)."""
    target = tmp_path / ("result" if folder is None else f"result-{folder.name}")
    if folder is not None and not target.exists():
        shutil.copytree(folder, target)
    target.mkdir(exist_ok=True)
    (target / "results.json").write_text(json.dumps(data))
    return vlens.load_result(target)


def _refused(tmp_path: Path, data: dict, key: str, folder: Path | None = None) -> str:
    """The one-line UserInputError of loading `data`; it names the file."""
    with pytest.raises(vlens.UserInputError) as caught:
        _load(tmp_path, data, folder)
    message = str(caught.value)
    assert "\n" not in message and "results.json" in message, message
    return message


def test_every_kind_has_a_saved_file():
    assert {f.name for f in FILES} == set(BUILTIN_KINDS) - set(NOT_COVERED)


@pytest.mark.parametrize("file", FILES, ids=lambda f: f.name)
def test_the_saved_file_loads_back_unchanged(file, tmp_path):
    data = _saved(file)
    loaded = _load(tmp_path, data, file)
    assert loaded.kind == data["kind"]
    assert first_difference(data, loaded.to_dict()) is None


@pytest.mark.parametrize("file", FILES, ids=lambda f: f.name)
def test_a_field_of_another_type_is_named(file, tmp_path):
    data = _saved(file)
    loaded = _load(tmp_path, data, file)
    own = _own_keys(data, loaded)
    assert own
    for key in own:
        tampered = copy.deepcopy(data)
        tampered[key] = _other_type(data[key])
        message = _refused(tmp_path, tampered, key, file)
        assert _names(message, key, loaded, data) != ((file.name, key) in UNNAMED), (key, message)


@pytest.mark.parametrize("file", FILES, ids=lambda f: f.name)
def test_a_missing_field_is_refused_or_has_a_default(file, tmp_path):
    data = _saved(file)
    loaded = _load(tmp_path, data, file)
    for key in _own_keys(data, loaded):
        tampered = {k: v for k, v in data.items() if k != key}
        try:
            again = _load(tmp_path, tampered, file)
        except vlens.UserInputError as error:
            assert "results.json" in str(error)
            continue
        # an optional field (files of older versions lack it): the result writes back everything else as saved
        assert first_difference(tampered, again.to_dict()) is None, key


def _null_first_int(value):
    """`value` with its first integer (not bool) replaced by null, and whether there was one: a top-level
    integer field or an integer in a list of integers (lists of lists too), where a result's own fields are."""
    if isinstance(value, int) and not isinstance(value, bool):
        return None, True
    if isinstance(value, list):
        for i, item in enumerate(value):
            new, done = _null_first_int(item)
            if done:
                return [*value[:i], new, *value[i + 1:]], True
    return value, False


@pytest.mark.parametrize("file", FILES, ids=lambda f: f.name)
def test_a_null_where_an_integer_is_needed_is_refused_or_declared_optional(file, tmp_path):
    data = _saved(file)
    loaded = _load(tmp_path, data, file)
    for key in _own_keys(data, loaded):
        new, found = _null_first_int(data[key])
        if not found:
            continue
        tampered = {**data, key: new}
        try:
            again = _load(tmp_path, tampered, file)
        except vlens.UserInputError as error:
            assert "results.json" in str(error)
            continue
        # the class declares the value optional (`int | None`): read as null, written back as null
        assert first_difference(tampered, again.to_dict()) is None, key


def test_lists_that_disagree_with_the_tensors_they_label_are_refused(tmp_path):
    data = _saved(SAVED / "patching")
    message = _refused(tmp_path, {**data, "layers": data["layers"][:-1]}, "layers")
    assert "n_layers" in message and ("'layers'" in message or "'metrics'" in message)
    metric = next(name for name in ("overwrite_rate", "logit_diff") if name in data)
    grid = [row[:-1] for row in data[metric]]  # one cell short in every row: a grid of another shape
    message = _refused(tmp_path, {**data, metric: grid}, metric)
    assert "metrics" in message or metric in message


# saved_dims fields that a saved file holds under another key, or leaves out when it is implied
SAVED_AS = {("patching", "cells"): "regions"}  # the layer-region patching file: its cells are regions
ABSENT = {  # (kind, field): a value of the wrong length to write in (the file leaves it out: every layer as wide)
    ("head_ablation", "heads_per_layer"): [4], ("head_scores", "heads_per_layer"): [4],
}
DECLARING = [file for file in FILES if getattr(result_class(_saved(file)["kind"]), "saved_dims", None)]


def _wrong_lengths(value, entry: str) -> list:
    """Values of `entry` (a saved_dims key) whose length no longer fits: one entry fewer and one more (an integer
    size: one more); for "name[*]" its first list shortened."""
    if entry.endswith("[*]"):
        first = next(iter(value.values() if isinstance(value, dict) else value))
        shorter = first[:-1]
        return [{**value, next(iter(value)): shorter} if isinstance(value, dict) else [shorter, *value[1:]]]
    if isinstance(value, int):
        return [value + 1]
    return [value[:-1], [*value, value[-1]]]


@pytest.mark.parametrize("file", DECLARING, ids=lambda f: f.name)
def test_every_declared_saved_dim_refuses_a_list_of_the_wrong_length(file, tmp_path):
    """Each entry of the class's `saved_dims`: its list one entry short or long (each list it holds, for
    "name[*]"; an integer size one more) is refused naming that field, never loaded as a different result."""
    data = _saved(file)
    cls = result_class(data["kind"])
    loaded = _load(tmp_path, data, file)
    assert len(DECLARING) >= 15  # the kinds whose lists label a tensor's axes or each other
    for entry in cls.saved_dims:
        name = entry.removesuffix("[*]")
        key = SAVED_AS.get((file.name, name), name)
        if key not in data:
            tampered_values = [ABSENT[(file.name, name)]]
        else:
            assert data[key], (entry, "an empty list in the saved file exercises nothing")
            tampered_values = _wrong_lengths(data[key], entry)
        for value in tampered_values:
            message = _refused(tmp_path, {**data, key: value}, key, file)
            assert f"'{key}" in message or f"'{name}" in message, (entry, message)
            assert "the field" in message, (entry, message)
    assert loaded.kind == data["kind"]


def test_the_class_reader_checks_too(tmp_path):
    data = _saved(SAVED / "patching")
    cls = result_class("patching")
    with pytest.raises(vlens.UserInputError, match=r"the field 'layers\[0\]' must be an integer"):
        read_checked(cls, {**data, "layers": ["a"] * len(data["layers"])}, tmp_path / "results.json")
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "results.json").write_text(json.dumps({**data, "layers": [None] * len(data["layers"])}))
    with pytest.raises(vlens.UserInputError, match=r"the field 'layers\[0\]' must be an integer"):
        cls.load(tmp_path / "p")

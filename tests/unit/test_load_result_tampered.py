"""`vlens.load_result` on tampered files: for every result kind (one real saved file each, made by
tests/helpers/saved_results.py), a missing field, a field of another type, a null where no NaN can be and a
list of the wrong length (every entry of each class's `saved_dims`) are each a `UserInputError` naming the file
and the field, never a traceback or a silently different result (before: KeyError / TypeError tracebacks, or the
tampered value kept). Inside fields, every key of every record schema (TypedDict) is tampered the same way
and refused naming its path ('nodes[41].name'); dicts that are no record are listed in FREE_FORM with why."""

from __future__ import annotations

import copy
import dataclasses
import json
import re
import shutil
import types
import typing
from pathlib import Path

import pytest

import vlens
from vlens.utils.results import BUILTIN_KINDS, read_checked, result_class
from vlens.utils.saved_fields import annotation_of, first_difference, fits, record_fields, saved_key

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


# ------------------------------------------------------------------ records inside a field (issue 42)
# Fields that hold dicts whose keys are not a fixed record (or whose records are not given a schema), and why. Every
# other dict inside a result is a record with a schema (a TypedDict: `vlens.utils.saved_fields`), checked below.
FREE_FORM = {
    ("patching", "extra"): "keys a command adds beside the result (the pairs' answers, ...), kept as written",
    ("circuit", "extra"): "keys of the file the circuit does not read, kept as written",
    ("ablation_report", "settings"): "the command's settings, recorded for provenance: any keys a version wrote",
    ("ablation_report", "patching"): "the patching sweep the heads were picked from: a nested result, not re-read",
    ("head_temperature", "source"): "where the temperatures came from: a result folder, or a study's own keys",
    ("evaluation", "settings"): "the command's settings, recorded for provenance",
    ("routing_statistics", "settings"): "the call's settings, recorded for provenance",
    ("sft", "config"): "the training config as written (`SFTConfig` fields of the version that trained)",
    ("study", "settings"): "the study's settings, recorded for provenance",
    ("study", "provenance"): "the study's own provenance block",
    ("study", "results"): "per seed, condition and task: an evaluation's metrics (tasks add their own keys)",
    ("study", "training"): "per seed and condition: an sft result, checked through its class (nested_results)",
    ("study", "temperatures"): "per seed: a head_temperature result, checked through its class (nested_results)",
    ("demo", "model"): "the model's description, recorded for provenance",
    ("demo", "settings"): "the demo's settings, recorded for provenance",
    ("demo", "timings_s"): "seconds per stage: any stages a version ran",
    ("demo", "sections"): "one section per stage, each the stage's own findings (text, numbers, figures)",
    ("attribution_graph", "images"): "per image: width, height and a PNG data URL for the viewer (not re-read)",
    ("attribution_graph", "cost"): "what the graph cost: passes and rows, any counters a version kept",
    ("attribution_graph", "settings"): "the call's settings, recorded for provenance",
    ("attribution_graph", "examples"): "the features' top examples (`vlens.graphs.examples`), for the viewer",
    ("knockout_sweep", "settings"): "the call's settings, recorded for provenance",
    ("steering", "settings"): "the call's settings, recorded for provenance",
    ("token_ablation", "settings"): "the call's settings, recorded for provenance",
    ("object_token_study", "settings"): "the study's settings, recorded for provenance",
    ("flow_study", "settings"): "the study's settings, recorded for provenance",
    ("flow_study", "sweeps"): "per task: a knockout_sweep result, checked through its class (nested_results)",
    ("generation_attribution", "settings"): "the call's settings, recorded for provenance",
}


def _record_schemas(annotation, where: str = "") -> list[tuple[str, type]]:
    """(where the records are below the field: "", "[*]", ".*"; the TypedDict) of every record type `annotation`
    holds (a list's items, a dict's values, a union's members)."""
    if typing.is_typeddict(annotation):
        return [(where, annotation)]
    found = []
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        for member in args:
            found += _record_schemas(member, where)
    elif origin in (list, tuple) and args:
        found += _record_schemas(args[0], where + "[*]")
    elif origin is dict and len(args) == 2:
        found += _record_schemas(args[1], where + ".*")
    return found


def _free(annotation) -> bool:
    """Whether `annotation` holds a dict whose keys no schema fixes (a bare dict, dict[str, Any], list[dict])."""
    if annotation is dict or annotation is typing.Any:
        return annotation is dict
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is dict:
        return not args or args[1] is typing.Any or _free(args[1])
    return any(_free(arg) for arg in args) if origin in (list, tuple, typing.Union, types.UnionType) else False


def _kinds():
    for kind in sorted(BUILTIN_KINDS):
        cls = result_class(kind)
        if isinstance(cls, type) and dataclasses.is_dataclass(cls):
            yield kind, cls


def test_every_free_form_dict_is_declared_with_its_reason():
    free = {(kind, field.name) for kind, cls in _kinds() for field in dataclasses.fields(cls)
            if _free(annotation_of(cls, field))}
    assert free == set(FREE_FORM), (sorted(free - set(FREE_FORM)), sorted(set(FREE_FORM) - free))


def _records_in(value, where: str, path: str):
    """(path, record) of every record `where` ("[*].*", ...) points at in `value`."""
    if not where:
        yield path, value
        return
    step, rest = (where[:3], where[3:]) if where.startswith("[*]") else (where[:2], where[2:])
    if step == "[*]" and isinstance(value, list):
        for i, item in enumerate(value):
            yield from _records_in(item, rest, f"{path}[{i}]")
    elif step == ".*" and isinstance(value, dict):
        for key, item in value.items():
            yield from _records_in(item, rest, f"{path}.{key}")


def _nested_cases(file: Path) -> list[tuple[str, list, object]]:
    """(path, tampered value or _DROP) of one tamper per key of every record schema the kind declares (another type;
    a required key removed), in the last record of the saved file that holds the key."""
    data = _saved(file)
    cls = result_class(data["kind"])
    loaded = vlens.load_result(file)
    cases = []
    for field in dataclasses.fields(cls):
        key = saved_key(loaded, field.name)
        if key not in data:
            continue
        for where, schema in _record_schemas(annotation_of(cls, field)):
            records = [(path, record) for path, record in _records_in(data[key], where, key) if isinstance(record, dict)]
            for name, annotation in record_fields(schema).items():
                for path, record in reversed(records):
                    if name in record:
                        cases.append((f"{path}.{name}", _not_of(annotation, record[name])))
                        if name in schema.__required_keys__:
                            cases.append((f"{path}.{name}", _DROP))
                        break
    return cases


_DROP = object()


def _not_of(annotation, value):
    """A JSON value that is not of `annotation` (of another type than `value` where that is enough)."""
    for candidate in (_other_type(value), "x", 7, 1.5, True, ["x"], {"x": 1}):
        if not fits(candidate, annotation):
            return candidate
    raise AssertionError(f"every JSON value fits {annotation}")


def _tamper(data: dict, path: str, value) -> dict:
    tampered = copy.deepcopy(data)
    steps = [int(s) if s.isdigit() and part.startswith("[") else s
             for part in re.findall(r"\[\d+\]|\.[^.\[]+|^[^.\[]+", path) for s in [part.strip("[].")]]
    here = tampered
    for step in steps[:-1]:
        here = here[step]
    if value is _DROP:
        del here[steps[-1]]
    else:
        here[steps[-1]] = value
    return tampered


def _has_schemas(file: Path) -> bool:
    cls = result_class(_saved(file)["kind"])
    return (isinstance(cls, type) and dataclasses.is_dataclass(cls)
            and any(_record_schemas(annotation_of(cls, field)) for field in dataclasses.fields(cls)))


NESTED = [file for file in FILES if _has_schemas(file)]


@pytest.mark.parametrize("file", NESTED, ids=lambda f: f.name)
def test_a_nested_record_value_of_another_type_or_missing_is_refused_by_its_path(file, tmp_path):
    """Every key of every record schema (a graph's nodes, a circuit's curve points, ...): a value of another type,
    or a required key removed, is refused naming its path ('nodes[41].name'), never loaded silently."""
    data = _saved(file)
    cases = _nested_cases(file)
    assert cases, "the saved file holds none of the records its class declares: it exercises nothing"
    for path, value in cases:
        message = _refused(tmp_path, _tamper(data, path, value), path, file)
        assert f"'{path}'" in message, (path, message)
        if value is _DROP:
            assert "missing" in message, (path, message)


def test_the_record_schemas_cover_the_records_the_issue_names():
    paths = {(file.name, re.sub(r"\[\d+\]", "[*]", path)) for file in NESTED for path, _ in _nested_cases(file)}
    for expected in [("attribution_graph", "nodes[*].name"), ("feature_intervention", "edits[*].layer"),
                     ("circuit", "curve[*].k"), ("transcoder_evaluation", "layers[*].layer")]:
        assert expected in paths, expected


def test_a_cell_label_of_another_type_is_named_by_the_key_the_file_holds_it_under(tmp_path):
    data = _saved(SAVED / "patching")  # a layer-region sweep: its cells are saved as "regions"
    message = _refused(tmp_path, {**data, "regions": [7, *data["regions"][1:]]}, "regions")
    assert "the field 'regions[0]' must be text, got int 7" in message, message


@pytest.mark.parametrize("kind", ["head_scores", "head_taxonomy", "head_temperature", "attribution_graph", "circuit"])
def test_a_list_with_an_entry_removed_is_named_not_the_fields_derived_from_it(kind, tmp_path):
    """A head (or an edge) removed, last or first: refused naming the list itself (before: a short head_scores
    list loaded as a model whose last layer has one head fewer; the others named 'n_edges', 'changed_heads',
    'counts.other' or 'scores.replacement', the fields written from the list, or loaded a graph an edge short)."""
    data = _saved(SAVED / kind)
    key = "edges" if kind in ("attribution_graph", "circuit") else "heads"
    for shorter in (data[key][:-1], data[key][1:]):
        message = _refused(tmp_path, {**data, key: shorter}, key, SAVED / kind)
        assert f"the field '{key}' " in message, message


def test_edge_scores_load_checks_the_file_as_load_result_does(tmp_path):
    from vlens.circuits.results import EdgeScores

    for kind in ("edge_scores", "circuit"):
        data = _saved(SAVED / kind)
        scores = data["scores"] if kind == "circuit" else data
        tampered = {**scores, "pair_ids": scores["pair_ids"][:-1]}  # loaded without a word by EdgeScores.load before
        (tmp_path / kind).mkdir()
        (tmp_path / kind / "results.json").write_text(json.dumps({**data, "scores": tampered} if kind == "circuit"
                                                                 else tampered))
        with pytest.raises(vlens.UserInputError, match="the field 'pair_ids' holds 1 entries"):
            EdgeScores.load(tmp_path / kind)
        assert EdgeScores.load(SAVED / kind).pair_ids == scores["pair_ids"]


NESTING = [file for file in FILES if getattr(result_class(_saved(file)["kind"]), "nested_results", ())]


@pytest.mark.parametrize("file", NESTING, ids=lambda f: f.name)
def test_a_value_inside_a_nested_result_is_refused_by_its_path(file, tmp_path):
    """A result kept as the dict its kind wrote (a flow study's sweeps, a study's temperatures and SFT runs, an
    object-token study's ablations) is read back by its own class: each of its own fields of another type, and its
    kind, refused naming the path (before: loaded without a word)."""
    data = _saved(file)
    cls = result_class(data["kind"])
    found = 0
    for name in cls.nested_results:
        stack = [(name, data[name])]
        while stack:
            path, value = stack.pop()
            if isinstance(value, dict) and value.get("kind") in BUILTIN_KINDS:
                nested = result_class(value["kind"])
                found += 1
                for key in [k for k in value if k in {f.name for f in dataclasses.fields(nested)}][:4] + ["kind"]:
                    message = _refused(tmp_path, _tamper(data, f"{path}.{key}", _other_type(value[key])), path, file)
                    assert f"'{path}.{key}" in message, (path, key, message)
                break  # one nested result per field
            items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else []
            stack.extend((f"{path}[{k}]" if isinstance(value, list) else f"{path}.{k}", v) for k, v in items)
    assert found, "the saved file holds none of the nested results its class declares"


@pytest.mark.parametrize(("kind", "path"), [("temperature_comparison", "temperature.heads[1].layer"),
                                            ("study", "temperatures.0.heads[0].layer"),
                                            ("sae_features", "features[1].frequency")])
def test_a_part_read_by_its_own_class_is_named_by_its_path_in_the_file(kind, path, tmp_path):
    """A value inside a part the class reads itself (a comparison's temperature, a study's nested result, a feature
    view saved under another key) is named by its path in the file, not the part's own field name (before:
    'heads[1].layer', "the field 'temperatures.0' ... the field 'heads'", 'views[1].frequency')."""
    data = _saved(SAVED / kind)
    message = _refused(tmp_path, _tamper(data, path, "x"), path, SAVED / kind)
    assert f"the field '{path}' must be " in message, message

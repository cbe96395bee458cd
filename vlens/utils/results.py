"""The protocol of every results object: `to_dict()`, `save(path)`, `load(path)`, `plot()`.

    result.to_dict()          # a JSON-safe dict (NaN / inf written as None), its "kind" first
    result.save("out/")       # out/results.json (a path ending in .json is the file itself)
    PatchingResult.load("out/")   # the object back: its to_dict() equals what was saved
    vlens.load_result("out/")     # the same, for any kind (read from the JSON's "kind")
    result.plot().show()      # a plotly figure (needs the `viz` extra)

The `vlens` command line writes each command's result the same way (`--out DIR` holds
`results.json` and the figures), so `vlens.load_result(DIR)` reads any command's output back.
Every result type names its `kind` (unique; `RESULT_KINDS`) and implements `from_dict`, the
inverse of `to_dict`. Keys a writer put beside the result's own (the command line's `model`,
`world_size`) are kept on the loaded object (`extras`) and written again by its `to_dict()`,
and so is the `provenance` block (`saved_provenance`): a loaded result's `to_dict()` is the file.
"""

from __future__ import annotations

import contextvars
import dataclasses
import functools
import importlib
import json
import math
import re
from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar, Protocol, TypeVar

from vlens.utils.errors import UserInputError
from vlens.utils.fileio import atomic_write_text
from vlens.utils.finite import json_safe
from vlens.utils.provenance import stamp
from vlens.utils.saved_fields import (
    check_fields,
    differences,
    failing_paths,
    first_difference,
    json_misfit,
    saved_key,
)
from vlens.utils.strict_json import loads_strict

RESULTS_FILE = "results.json"

# kind -> the module that defines the built-in result of that kind ("module:attribute" where it is no
# `Result`): `result_class` imports it on first use, so reading one result loads only its package
# (a third-party `Result` subclass registers its own kind when its module is imported)
BUILTIN_KINDS: dict[str, str] = {
    "patching": "vlens.patching.results",
    "attribution_patching": "vlens.patching.attribution",
    "edge_scores": "vlens.circuits.results",
    "path_patching": "vlens.circuits.results",
    "circuit": "vlens.circuits.extraction",
    "image_attribution": "vlens.circuits.image_attribution",
    "logit_lens": "vlens.lens.logit_lens",
    "head_scores": "vlens.lens.head_scores",
    "headlens_output": "vlens.lens.headlens",
    "head_taxonomy": "vlens.lens.taxonomy",
    "lens_training": "vlens.lens.translators",
    "lens": "vlens.lens.translators:Translators",
    "head_ablation": "vlens.ablation.results",
    "ablation_report": "vlens.ablation.results",
    "head_temperature": "vlens.interventions.temperature",
    "temperature_comparison": "vlens.interventions.temperature",
    "evaluation": "vlens.evaluation.runner",
    "routing_statistics": "vlens.routing.statistics",
    "sft": "vlens.training.sft",
    "study": "vlens.studies.interventions",
    "demo": "vlens.demo.results",
    "sae_training": "vlens.sae.trainer",
    "sae_splice_evaluation": "vlens.sae.evaluation",
    "sae_features": "vlens.sae.features",
    "transcoder_training": "vlens.transcoders.trainer",
    "transcoder_evaluation": "vlens.transcoders.evaluation",
    "attribution_graph": "vlens.graphs.results",
    "feature_intervention": "vlens.graphs.interventions",
    "knockout_sweep": "vlens.flow.sweep",
    "steering": "vlens.steering.results",
    "token_ablation": "vlens.flow.ablation",
    "object_token_study": "vlens.studies.object_tokens",
    "flow_study": "vlens.studies.flow",
    "verification": "vlens.verify.results",
    "generation_attribution": "vlens.generation_attribution.results",
}
# the files a command's --out folder may hold its result in, in the order they are tried
RESULT_FILES = (RESULTS_FILE, "sft_result.json", "study.json", "vlens_temperature.json", "config.json")
RESULT_KINDS: dict[str, type[Result]] = {}  # kind -> class, filled as result modules are imported

R = TypeVar("R", bound="Result")


class SavedResult(Protocol):
    """What `load_result` returns: a `Result`, or a saved object that is not one (a trained lens)."""

    def to_dict(self) -> dict: ...


def _recording_kind(to_dict: Callable[..., dict]) -> Callable[..., dict]:
    """`to_dict` with the result's "kind" first, and last the extras and the `provenance` a loaded result was
    saved with (so that a loaded result's `to_dict()` is the file it was read from)."""

    @functools.wraps(to_dict)
    def wrapped(self: Result, *args: Any, **kwargs: Any) -> dict:
        data = to_dict(self, *args, **kwargs)
        out: dict[str, Any] = {"kind": type(self).kind}
        out.update((key, value) for key, value in data.items() if key != "kind")
        out.update(self.extras)
        if "provenance" not in out and self.saved_provenance is not None:  # a result with its own keeps it
            out["provenance"] = self.saved_provenance
        return out

    wrapped.records_kind = True  # type: ignore[attr-defined]
    return wrapped


def _reading_kind(from_dict: Callable[..., Any]) -> Callable[..., Any]:
    """`from_dict` that accepts what `to_dict` wrote whole: checks and drops its "kind"; its "provenance" is kept
    on the result (`saved_provenance`), which `to_dict` writes again (a result nested in another's file too)."""

    @functools.wraps(from_dict)
    def wrapped(cls: type[Result], data: dict) -> Any:
        kind = data.get("kind")
        if kind is not None and kind != cls.kind:
            raise UserInputError(f"this holds a {kind!r} result, not a {cls.kind!r} one ({cls.__qualname__}): "
                                 "read it with vlens.load_result")
        own_provenance = "provenance" in getattr(cls, "__dataclass_fields__", {})  # a result that keeps its own
        dropped = ("kind",) if own_provenance else ("kind", "provenance")
        result = from_dict(cls, {key: value for key, value in data.items() if key not in dropped})
        if not own_provenance and isinstance(data.get("provenance"), dict) and isinstance(result, Result):
            result.__dict__["_provenance"] = data["provenance"]
        return result

    wrapped.records_kind = True  # type: ignore[attr-defined]
    return wrapped


SUMMARY_CHARS = 400  # a result's repr stays a line or two, whatever it holds


def _summary_value(value: Any) -> str:
    """A short stand-in for one field: a tensor's shape, a number, a short string, a container's length."""
    shape = getattr(value, "shape", None)
    if shape is not None and not isinstance(value, (int, float)):
        return f"{type(value).__name__}{list(shape)}"
    if isinstance(value, float):
        return f"{value:.4g}"
    if value is None or isinstance(value, (bool, int)):
        return repr(value)
    if isinstance(value, str):
        return repr(value if len(value) <= 40 else value[:37] + "...")
    if isinstance(value, tuple) and len(value) <= 4 and all(isinstance(v, (int, float)) for v in value):
        return "(" + ", ".join(_summary_value(v) for v in value) + ")"
    if isinstance(value, (list, tuple, dict, set)):
        return f"{type(value).__name__}[{len(value)}]"
    return type(value).__name__


def result_summary(result: Any) -> str:
    """``Name(kind=..., field=summary, ...)``: tensors as their shapes, numbers, container lengths;
    never a tensor's values or a page of HTML (what the REPL and `print` show of every result)."""
    names = ([f.name for f in dataclasses.fields(result)] if dataclasses.is_dataclass(result)
             else [k for k in vars(result) if not k.startswith("_")])
    parts = [f"kind={type(result).kind!r}"] + [f"{name}={_summary_value(getattr(result, name, None))}"
                                               for name in names]
    text = f"{type(result).__name__}({', '.join(parts)})"
    return text if len(text) <= SUMMARY_CHARS else text[:SUMMARY_CHARS - 5] + " ...)"


class Result(ABC):
    """Base of every results object (patching, lenses, head scores, ablation, temperatures, ...).

    A subclass sets `kind` (recorded as "kind" in its JSON; unique across result types) and
    implements `to_dict` and its inverse `from_dict`; `load` then reads what `save` wrote.
    """

    filename: ClassVar[str] = RESULTS_FILE  # what `save(folder)` writes inside the folder
    kind: ClassVar[str] = ""  # what the JSON records as "kind" (`vlens.load_result` reads it)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        own = cls.__dict__.get("to_dict")
        if own is not None and not getattr(own, "records_kind", False):
            cls.to_dict = _recording_kind(own)  # type: ignore[method-assign]
        reader = cls.__dict__.get("from_dict")
        if isinstance(reader, classmethod) and not getattr(reader.__func__, "records_kind", False):
            cls.from_dict = classmethod(_reading_kind(reader.__func__))  # type: ignore[method-assign,assignment]
        kind = cls.__dict__.get("kind")
        if isinstance(kind, str) and kind:
            known = RESULT_KINDS.get(kind)
            if known is not None and known.__qualname__ != cls.__qualname__:
                raise TypeError(f"result kind {kind!r} is taken by {known.__module__}.{known.__qualname__}: "
                                f"give {cls.__qualname__} another kind")
            RESULT_KINDS[kind] = cls
        if cls.__repr__ is Result.__repr__:
            # in the class's own dict, so that @dataclass keeps it instead of writing a repr of every field
            cls.__repr__ = Result.__repr__  # type: ignore[method-assign]

    def __repr__(self) -> str:
        return result_summary(self)

    @property
    def extras(self) -> dict:
        """Keys the saved JSON held beside the result's own (e.g. the command line's `model`,
        `world_size`); empty for a result that was not loaded."""
        return self.__dict__.get("_extras", {})

    @property
    def saved_provenance(self) -> dict | None:
        """The `provenance` block of the file (or dict) a loaded result was read from, which its `to_dict()` writes
        again (None for a result that was never saved)."""
        return self.__dict__.get("_provenance")

    @abstractmethod
    def to_dict(self) -> dict:
        """Everything needed to read the result back: JSON-safe (lists, numbers, strings, None)."""

    @classmethod
    def from_dict(cls: type[R], data: dict) -> R:
        """The result `to_dict` described (the inverse of `to_dict`)."""
        raise NotImplementedError(f"{cls.__qualname__} cannot be read back (it has no from_dict)")

    @classmethod
    def load(cls: type[R], path: str | Path) -> R:
        """Read what `save` wrote: the JSON file, or the folder holding `filename`; its `to_dict()`
        equals what was saved, its provenance included (also `saved_provenance`)."""
        path = Path(path)
        file = path / cls.filename if path.is_dir() else path
        return read_checked(cls, cls.read_saved(path), file)

    @classmethod
    def from_saved(cls: type[R], data: dict, folder: Path | None = None) -> R:
        """The result of a saved dict (`load`): checks its kind, keeps its provenance and extras.
        folder: where it was read from (a result whose parts live in other files reads them there)."""
        result = cls.from_dict(data)  # checks the kind
        body = {key: value for key, value in data.items() if key not in ("kind", "provenance")}
        return cls.attach_saved(result, body, data.get("provenance"))

    @staticmethod
    def attach_saved(result: R, body: dict, provenance: dict | None) -> R:
        """Keep on `result` the keys of `body` its own `to_dict` does not write (the extras) and the provenance."""
        reading = _READING.get()
        if reading is not None:  # read from a file (`read_checked`): its fields checked before its methods use them
            check_fields(result, reading.source)
            check_nested_results(result, reading.source)
        own = result.to_dict()
        result.__dict__["_extras"] = {key: value for key, value in body.items() if key not in own}
        result.__dict__["_provenance"] = provenance
        if reading is not None:
            reading.result, reading.written = result, {**own, **result.extras}  # what to_dict() now gives
        return result

    def to_dataframe(self) -> Any:
        """The result's numbers as a tidy pandas DataFrame: one row per number of `to_dict()`.

        Columns: "field" (the key path, e.g. "effects" or "summary.mean"), "index" (the position inside a
        nested list as a tuple, () for a scalar) and "value" (NaN where the JSON holds null); strings and
        other non-numbers are left out. Needs pandas (`pip install pandas`).
        """
        try:
            import pandas as pd
        except ImportError as error:
            raise ImportError("to_dataframe needs pandas: pip install pandas") from error
        rows: list[tuple[str, tuple, float]] = []

        def walk(value: Any, field: str, index: tuple) -> None:
            if isinstance(value, bool):
                rows.append((field, index, float(value)))
            elif isinstance(value, (int, float)):
                rows.append((field, index, float(value)))
            elif value is None and index:
                rows.append((field, index, math.nan))
            elif isinstance(value, dict):
                for key, item in value.items():
                    walk(item, f"{field}.{key}" if field else str(key), index)
            elif isinstance(value, (list, tuple)):
                for i, item in enumerate(value):
                    walk(item, field, index + (i,))

        walk({key: value for key, value in self.to_dict().items() if key not in ("kind", "provenance")}, "", ())
        return pd.DataFrame(rows, columns=["field", "index", "value"])

    @abstractmethod
    def plot(self, *args: Any, **kwargs: Any) -> Any:
        """The result's main figure (a plotly Figure; needs the `viz` extra)."""

    def save(self, path: str | Path) -> Path:
        """Write `to_dict()` as strict JSON, with its `provenance` (`vlens.utils.provenance.stamp`): to
        `path` if it ends in .json, else to `path / filename` (folders are created). Returns the file written."""
        path = Path(path)
        target = path if path.suffix == ".json" else path / self.filename
        # whole or absent (temporary file, fsync, rename): an interrupt never leaves a truncated file
        data = self.to_dict()  # a loaded result's holds the provenance it was read with: still how it was made
        return atomic_write_text(target, json.dumps(json_safe(stamp(data)), indent=1, allow_nan=False) + "\n")

    @classmethod
    def read_saved(cls, path: str | Path) -> dict:
        """The dict a `save` wrote: the JSON file itself, or `path / filename` for a folder."""
        path = Path(path)
        file = path / cls.filename if path.is_dir() else path
        return loads_strict(file.read_text(encoding="utf-8"), str(file))


def own_fields(cls: type, data: dict) -> dict:
    """The items of `data` that are fields of the dataclass `cls` (a `from_dict` that is `cls(**data)`
    leaves the rest to the extras)."""
    names = getattr(cls, "__dataclass_fields__", {})
    return {key: value for key, value in data.items() if key in names}


def nan_tensor(values: Any, dtype: Any = None) -> Any:
    """A float tensor of nested lists where JSON null stands for NaN (what `json_safe` wrote)."""
    import torch

    def fill(value: Any) -> Any:
        if value is None:
            return math.nan
        return [fill(v) for v in value] if isinstance(value, list) else value

    return torch.tensor(fill(values), dtype=dtype or torch.float32)


READER_ERRORS = (KeyError, TypeError, ValueError, IndexError, AttributeError, RuntimeError, OverflowError)


def _culprit(cls: type, data: dict, error: BaseException) -> tuple[list[str], str | None]:
    """Where in the file a reader's `error` came from: the fields the failing expression read (`failing_paths`),
    unless a field holds a JSON value its annotation is never saved as (`json_misfit`) and the expression read
    none of it (the reader went wrong because of that field, e.g. a task that picked another branch): then that
    field and why it does not fit. A required argument the class was built without is a missing field."""
    absent = [name for name in re.findall(r"'(\w+)'", str(error).partition("required")[2]) if name not in data]
    if isinstance(error, TypeError) and "missing" in str(error) and absent:
        return absent, "is missing"
    paths = failing_paths(error, data)
    misfit = json_misfit(cls, data)
    if misfit is not None:
        within = [p for p in paths if p == misfit[0] or p.startswith((f"{misfit[0]}.", f"{misfit[0]}["))]
        return (within, None) if within else ([misfit[0]], misfit[1])
    return paths, None


def _within(paths: list[str], message: str) -> str:
    """A class's own message about a field, said of the field of the file it came from: where the class names a part
    of a field the reader was reading (``the field 'heads[1].layer'`` of the file's ``temperature.heads``), the part's
    whole path (``temperature.heads[1].layer``); else the message after the fields read."""
    named = re.match(r"the field '([^']+)'", message)
    if named and paths:
        part = named.group(1)
        head = re.match(r"[^.\[]*", part)
        first = head.group(0) if head else part
        for path in paths:
            if part == path or part.startswith((f"{path}.", f"{path}[")):
                return message
            if path.endswith(f".{first}"):
                return message.replace(f"'{part}'", f"'{path[: -len(first)]}{part}'", 1)
    return (f"{_the_field(paths)}: " if paths else "") + message


def _the_field(paths: list[str]) -> str:
    return "the field " + " or ".join(map(repr, paths))


@dataclasses.dataclass
class _Reading:
    """A file `read_checked` is reading: `attach_saved` checks the object built and keeps what it writes back."""

    source: str
    result: Any = None
    written: dict | None = None


_READING: contextvars.ContextVar[_Reading | None] = contextvars.ContextVar("vlens_reading_result", default=None)


def read_checked(cls: type[R], data: dict, file: Path) -> R:
    """`cls.from_saved(data)` of a file a user may have edited: a field missing or not fitting its kind, a field
    of the wrong type or shape (`vlens.utils.saved_fields.check_fields`, declared by each class's annotations
    and ``saved_dims``), and a result that does not write back what the file holds are each a
    `UserInputError` naming the file and the field, never a traceback or a silently different result.
    The object built is checked before anything uses it (`attach_saved`), so a value its own methods would
    trip over is named as the field it was read into."""
    source = f"{file} ({cls.kind!r} result)"
    redo = "write it again with the command or call that made it"
    reading = _Reading(source)
    token = _READING.set(reading)
    try:
        result = cls.from_saved(data, file.parent)
    except UserInputError as error:  # the class's own check of a value: said of this file and field
        if str(file) in str(error):
            raise
        paths, _ = _culprit(cls, data, error)
        raise UserInputError(f"{source}: {_within(paths, str(error))}") from None
    except KeyError as error:
        key = error.args[0] if error.args else "?"
        if isinstance(key, str) and key not in data and failing_paths(error, data) in ([], [key]):
            raise UserInputError(f"{source}: the field {key!r} is missing (the file was cut short or edited): "
                                 f"{redo}") from None
        paths, problem = _culprit(cls, data, error)
        nested = [p for p in paths if isinstance(key, str) and p.endswith(f".{key}")]
        what = (f"{_the_field(paths)} {problem}" if paths and problem
                else f"{_the_field(nested)} is missing" if nested
                else f"{_the_field(paths)} holds {key!r}, a value the reader does not know, or lacks a part"
                if paths else f"{key!r} is a value the reader does not know, or a part is missing")
        raise UserInputError(f"{source}: {what} (the file was cut short or edited): {redo}") from None
    except READER_ERRORS as error:
        paths, problem = _culprit(cls, data, error)
        if paths and problem:  # a field missing, or a value of another kind: that says it
            raise UserInputError(f"{source}: {_the_field(paths)} {problem} (the file was edited or written by "
                                 f"another version): {redo}") from None
        where = f"{_the_field(paths)} does not fit" if paths else "its fields do not fit"
        raise UserInputError(f"{source}: {where} a {cls.kind!r} result ({type(error).__name__}: {str(error)[:160]}): "
                             f"the file was edited or written by another version; {redo}") from None
    finally:
        _READING.reset(token)
    checked = reading.result is result and reading.written is not None  # (a from_saved without attach_saved: not)
    if not checked:
        check_fields(result, source)
        check_nested_results(result, source)
    body = {key: value for key, value in data.items() if key not in ("kind", "provenance")}
    written = reading.written if checked else result.to_dict()  # to_dict once: some compute (rank correlations)
    differ = differences(json_safe(body), json_safe(written))
    if differ:
        fields = ", ".join(repr(path) for path in differ[:4]) + (f" (+{len(differ) - 4} more)" if len(differ) > 4 else "")
        raise UserInputError(f"{source}: the field{'s' if len(differ) > 1 else ''} {fields} do{'' if len(differ) > 1 else 'es'} "
                             f"not read back as saved (a value of another type, or one that disagrees with the other "
                             f"fields): {redo}")
    return result


# nested results read from their own folder's files too (predictions, weights): kept as written, not re-read here
_READ_WITH_FILES = ("evaluation", "sae_training", "transcoder_training", "lens")


def check_nested_results(result: Any, source: str) -> None:
    """Every result that a field named in the class's ``nested_results`` keeps as the dict its kind's `to_dict` wrote
    (a flow study's knockout sweeps, a study's temperatures and SFT runs, an object-token study's token ablations):
    read back by its own class and checked as a file of that kind is (`check_fields`, written back as saved), so
    that a value inside it of another type is named by its path (``sweeps.colour.n``), not kept without a word.
    (Declared per field: a demo section holds a circuit's figures under its kind, not the whole result.)"""
    for name in getattr(type(result), "nested_results", ()):
        _check_nested(getattr(result, name, None), saved_key(result, name), source, 0)


def _check_nested(value: Any, path: str, source: str, depth: int) -> None:
    if depth > 4:
        return
    if isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            _check_nested(item, f"{path}[{i}]", source, depth + 1)
        return
    if not isinstance(value, dict):
        return
    kind = value.get("kind")
    known = isinstance(kind, str) and (kind in RESULT_KINDS or kind in BUILTIN_KINDS)
    if depth > 0 and "kind" in value and not known:  # (where results are kept, a "kind" is a result's)
        raise UserInputError(f"{source}: the field {f'{path}.kind'!r} names no result kind, got {kind!r}: the file "
                             "was edited or written by another version")
    cls = result_class(str(kind)) if known and depth > 0 and kind not in _READ_WITH_FILES else None
    if not (isinstance(cls, type) and issubclass(cls, Result)):
        for key, item in value.items():
            _check_nested(item, f"{path}.{key}", source, depth + 1)
        return
    try:
        nested = cls.from_dict(value)
    except UserInputError as error:
        named = re.match(r"the field '([^']+)'(.*)", str(error))
        if named:  # the nested class's own message about one of its fields: that field's path in the file
            raise UserInputError(f"{source}: the field {f'{path}.{named.group(1)}'!r}{named.group(2)}") from None
        raise UserInputError(f"{source}: the field {path!r} does not read as a {kind!r} result: {error}") from None
    except READER_ERRORS as error:
        inner = failing_paths(error, value)
        where = " or ".join(repr(f"{path}.{p}") for p in inner) if inner else repr(path)
        raise UserInputError(f"{source}: the field {where} does not fit a {kind!r} result ({type(error).__name__}: "
                             f"{str(error)[:120]}): the file was edited or written by another version") from None
    check_fields(nested, source, f"{path}.")
    check_nested_results(nested, source)
    body = {key: item for key, item in value.items() if key not in ("kind", "provenance")}
    differ = first_difference(json_safe(body), json_safe({key: item for key, item in nested.to_dict().items()
                                                          if key in body}))
    if differ is not None:
        raise UserInputError(f"{source}: the field {f'{path}.{differ}'!r} does not read back as saved (a value of "
                             "another type, or one that disagrees with the other fields): write it again with the "
                             "command or call that made it")


def result_class(kind: str) -> Any:
    """The class (or loader) of a result kind: a registered `Result` subclass, else the built-in one."""
    if kind not in RESULT_KINDS and kind in BUILTIN_KINDS:
        module, _, attribute = BUILTIN_KINDS[kind].partition(":")
        loaded = importlib.import_module(module)
        if attribute:
            return getattr(loaded, attribute)
    if kind not in RESULT_KINDS:
        raise UserInputError(f"unknown result kind {kind!r}; known kinds: {sorted(set(BUILTIN_KINDS) | set(RESULT_KINDS))} "
                             "(a plugin's result is known once its module is imported)")
    return RESULT_KINDS[kind]


def result_file(path: str | Path) -> Path:
    """The JSON file that holds the result of `path`: the file itself, or in a folder the first of
    `RESULT_FILES` that records a "kind"."""
    path = Path(path)
    if not path.exists():
        raise UserInputError(f"{path} does not exist: pass a command's --out folder or its results.json")
    if path.is_file():
        return path
    for name in RESULT_FILES:
        candidate = path / name
        if candidate.is_file() and isinstance(_read_json(candidate).get("kind"), str):
            return candidate
    if (path / "config.json").is_file() and any(path.glob("*.safetensors")):
        raise UserInputError(f"{path} holds no result but a model (`vlens zoo train`, `vlens train --merged`): "
                             "load it with vlens.load_model")
    if (path / ".vlens_dataset.json").is_file():
        raise UserInputError(f"{path} holds no result but a dataset (`vlens data`): read it with "
                             "vlens.datasets.load_dataset")
    raise UserInputError(f"{path} holds no result ({', '.join(RESULT_FILES)} with a \"kind\"): pass the --out "
                         "folder of a vlens command (a folder written by an older vlens records no kind: run it again)")


def _read_json(path: Path) -> dict:
    try:
        data = loads_strict(path.read_text(encoding="utf-8"), str(path))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise UserInputError(f"{path} is not a JSON result file: {error}") from None
    return data if isinstance(data, dict) else {}


def load_result(path: str | Path) -> SavedResult:
    """The typed result of any command's `--out` folder (or of its results.json, or of any file a
    `Result.save` wrote): `PatchingResult`, `Circuit`, `HeadTaxonomy`, `AblationReport`,
    `EvalResult`, ... chosen by the "kind" the JSON records; a `vlens lens train` folder gives its
    `Translators`. Its `to_dict()` equals what was saved, the provenance block included.

    Raises `UserInputError` when the path holds no result or one of an unknown kind.
    """
    file = result_file(path)
    data = _read_json(file)
    kind = data.get("kind")
    if not isinstance(kind, str):
        raise UserInputError(f"{file} records no result \"kind\": it was not written by Result.save or a vlens "
                             "command (or by an older vlens: run the command again)")
    loader = result_class(kind)
    if isinstance(loader, type) and issubclass(loader, Result):
        return read_checked(loader, data, file)
    return loader.load(file.parent)


__all__ = ["BUILTIN_KINDS", "RESULTS_FILE", "RESULT_FILES", "RESULT_KINDS", "Result", "SavedResult", "load_result",
           "nan_tensor", "own_fields", "read_checked", "result_class", "result_file"]

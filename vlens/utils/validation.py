"""Checks for user-supplied values, shared by the Python API and the command line.

Every check raises `vlens.utils.errors.UserInputError` (a `ValueError`) with one line naming the
argument, the allowed range and the value given, and returns the value normalised (an `int`,
a finite `float`, a `Path`). The API passes parameter names (``"limit"``), the command line
passes flags (``"--limit"``); `arg_int` / `arg_float` / `arg_choice` wrap the same checks as
argparse ``type=`` callables, so a bad flag fails while parsing, before any model loads::

    check_count(limit, "limit", allow_none=True)       # API
    parser.add_argument("--limit", type=arg_int(min=1))  # CLI

Output paths: `check_output_file` / `check_output_folder` say before any compute whether a
result can be written where the user asked (writable, not a folder where a file is meant,
not an existing model folder unless ``overwrite``).
"""

from __future__ import annotations

import argparse
import math
import numbers
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Literal, overload

from vlens.utils.errors import UserInputError

# files whose presence makes a folder an HF model / adapter folder (never replaced silently)
MODEL_FOLDER_FILES = ("config.json", "model.safetensors", "model.safetensors.index.json",
                      "adapter_model.safetensors", "adapter_config.json")


def range_text(min: float | None = None, max: float | None = None, integer: bool = False,
               min_open: bool = False, max_open: bool = False) -> str:
    """ "an integer >= 1", "a finite number in (0, 1]", ...: the allowed range in words."""
    kind = "an integer" if integer else "a finite number"
    if min is not None and max is not None:
        return f"{kind} in {'(' if min_open else '['}{min}, {max}{')' if max_open else ']'}"
    if min is not None:
        return f"{kind} {'>' if min_open else '>='} {min}"
    if max is not None:
        return f"{kind} {'<' if max_open else '<='} {max}"
    return kind


def _fail(name: str, expected: str, value: Any) -> UserInputError:
    return UserInputError(f"{name} must be {expected}, got {value!r}")


@overload
def check_int(value: Any, name: str, min: int | None = None, max: int | None = None,
              allow_none: Literal[False] = False) -> int: ...
@overload
def check_int(value: Any, name: str, min: int | None = None, max: int | None = None, *,
              allow_none: bool) -> int | None: ...
def check_int(value: Any, name: str, min: int | None = None, max: int | None = None,
              allow_none: bool = False) -> int | None:
    """`value` as an int in [min, max]; rejects bools, fractions, NaN and strings."""
    if value is None and allow_none:
        return None
    expected = range_text(min, max, integer=True) + (" (or None)" if allow_none else "")
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        if isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value) \
                and float(value).is_integer():
            value = int(float(value))
        else:
            raise _fail(name, expected, value)
    value = int(value)
    if (min is not None and value < min) or (max is not None and value > max):
        raise _fail(name, expected, value)
    return value


@overload
def check_count(value: Any, name: str, min: int = 1, max: int | None = None,
                allow_none: Literal[False] = False) -> int: ...
@overload
def check_count(value: Any, name: str, min: int = 1, max: int | None = None, *,
                allow_none: bool) -> int | None: ...
def check_count(value: Any, name: str, min: int = 1, max: int | None = None, allow_none: bool = False) -> int | None:
    """A count, limit, size or number of steps: an int >= `min` (default 1)."""
    return check_int(value, name, min=min, max=max, allow_none=allow_none)


@overload
def check_float(value: Any, name: str, min: float | None = None, max: float | None = None,
                min_open: bool = False, max_open: bool = False, allow_none: Literal[False] = False) -> float: ...
@overload
def check_float(value: Any, name: str, min: float | None = None, max: float | None = None,
                min_open: bool = False, max_open: bool = False, *, allow_none: bool) -> float | None: ...
def check_float(value: Any, name: str, min: float | None = None, max: float | None = None,
                min_open: bool = False, max_open: bool = False, allow_none: bool = False) -> float | None:
    """`value` as a finite float in the given range (NaN and inf are always refused)."""
    if value is None and allow_none:
        return None
    expected = range_text(min, max, min_open=min_open, max_open=max_open) + (" (or None)" if allow_none else "")
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise _fail(name, expected, value)
    value = float(value)
    if not math.isfinite(value):
        raise _fail(name, expected, value)
    if min is not None and (value < min or (min_open and value == min)):
        raise _fail(name, expected, value)
    if max is not None and (value > max or (max_open and value == max)):
        raise _fail(name, expected, value)
    return value


def check_top_k(k: Any, name: str, n: int, what: str = "heads") -> int:
    """k of n items for a top-k set that is compared across runs: 1 <= k < n (k = n picks every
    item, so every overlap would be 1.0)."""
    if n < 2:
        raise UserInputError(f"{name}: a top-k set needs at least 2 {what} to choose from, the model has {n}")
    try:
        return check_int(k, name, min=1, max=n - 1)
    except UserInputError:
        raise UserInputError(f"{name} must be an integer in [1, {n - 1}] (fewer than the {n} {what}; "
                             f"k = {n} would select them all), got {k!r}") from None


def check_choice(value: Any, name: str, choices: Iterable[str]) -> str:
    """`value` is one of `choices` (listed in the error)."""
    choices = list(choices)
    if value not in choices:
        raise UserInputError(f"{name} must be one of {', '.join(map(str, choices))}; got {value!r}")
    return value


# ---------------------------------------------------------------------- paths
def is_model_folder(path: str | os.PathLike) -> bool:
    """True for a folder holding an HF model or adapter (config + weights)."""
    path = Path(path)
    return path.is_dir() and any((path / name).exists() for name in MODEL_FOLDER_FILES)


def _nearest_existing(path: Path) -> Path:
    current = path.absolute()
    while not current.exists() and current != current.parent:
        current = current.parent
    return current


def _check_creatable(path: Path, name: str) -> None:
    """The first existing ancestor of `path` is a writable folder."""
    anchor = path if path.is_dir() else _nearest_existing(path.parent)
    if not anchor.is_dir():
        raise UserInputError(f"{name} {path}: {anchor} is a file, so nothing can be created below it")
    if not os.access(anchor, os.W_OK | os.X_OK):
        raise UserInputError(f"{name} {path}: {anchor} is not writable")


def check_output_file(path: str | os.PathLike, name: str = "--out") -> Path:
    """A file that can be written: not a folder, its folder creatable and writable."""
    path = Path(path)
    if path.is_dir():
        raise UserInputError(f"{name} {path} is a folder; give a file path, e.g. {path / 'results.json'}")
    if path.exists() and not os.access(path, os.W_OK):
        raise UserInputError(f"{name} {path} exists and is not writable")
    _check_creatable(path, name)
    return path


def check_output_folder(path: str | os.PathLike, name: str = "--out", overwrite: bool = False,
                        model_folder: bool = False) -> Path:
    """A folder that can be written: not a file, creatable and writable.

    model_folder: the command writes a model folder, which replaces the folder's content as a
        whole; an existing model folder needs `overwrite`, and a non-empty folder that is not a
        model folder is refused (its files would be lost).
    An existing model folder is never a valid target for a command that writes results into
    it (model_folder=False) unless `overwrite`: its files could be mixed with the results.
    """
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise UserInputError(f"{name} {path} is a file; give a folder path")
    _check_creatable(path, name)
    if path.is_dir() and is_model_folder(path) and not overwrite:
        raise UserInputError(f"{name} {path} already holds a model; pass --overwrite to replace it or choose "
                             "another folder")
    if model_folder and path.is_dir() and not is_model_folder(path) and any(path.iterdir()):
        raise UserInputError(f"{name} {path} is a non-empty folder that is not a model folder; writing a model "
                             "there would replace its files: choose an empty or new folder")
    return path


def check_output_apart(out: str | os.PathLike, inputs: Iterable[tuple[str, Any]], name: str = "--out") -> None:
    """Refuse an output path equal to, inside, or containing an input (a model or data folder, an input
    file): writing there would replace or mix with what the command reads (``temperature export --model M
    --out M --overwrite`` replaced the source weights). `inputs`: (flag, path) pairs; paths that do not
    exist, and values that are not paths (a hub id, a built-in model name), are skipped."""
    target = Path(out).expanduser().resolve()
    for flag, value in inputs:
        if not isinstance(value, (str, os.PathLike)) or not Path(value).expanduser().exists():
            continue
        source = Path(value).expanduser().resolve()
        if target == source:
            relation = "is"
        elif source in target.parents:
            relation = "is inside"
        elif target in source.parents:
            relation = "contains"
        else:
            continue
        raise UserInputError(f"{name} {out} {relation} the input {flag} {value}: the output would replace or mix "
                             f"with what the command reads; choose a folder outside it")


# ---------------------------------------------------------------------- argparse adapters
def _parse_number(text: str, cast: Callable[[str], Any], expected: str) -> Any:
    try:
        return cast(text)
    except (TypeError, ValueError):
        raise argparse.ArgumentTypeError(f"must be {expected}, got {text!r}") from None


def arg_int(min: int | None = None, max: int | None = None) -> Callable[[str], int]:
    """argparse ``type=`` for an int in [min, max]: ``type=arg_int(min=1)``."""
    expected = range_text(min, max, integer=True)

    def parse(text: str) -> int:
        value = _parse_number(text, int, expected)
        try:
            return check_int(value, "value", min=min, max=max)
        except UserInputError:
            raise argparse.ArgumentTypeError(f"must be {expected}, got {text!r}") from None

    parse.__name__ = "int"
    return parse


def arg_float(min: float | None = None, max: float | None = None, min_open: bool = False,
              max_open: bool = False) -> Callable[[str], float]:
    """argparse ``type=`` for a finite float in a range: ``type=arg_float(min=0)``."""
    expected = range_text(min, max, min_open=min_open, max_open=max_open)

    def parse(text: str) -> float:
        value = _parse_number(text, float, expected)
        try:
            return check_float(value, "value", min=min, max=max, min_open=min_open, max_open=max_open)
        except UserInputError:
            raise argparse.ArgumentTypeError(f"must be {expected}, got {text!r}") from None

    parse.__name__ = "float"
    return parse


def arg_path(text: str) -> Path:
    """argparse ``type=`` for a file or folder path: an empty one is refused (``Path("")`` would be
    the working folder, so ``--out ''`` would write there), as is one holding a NUL byte."""
    if not text.strip():
        raise argparse.ArgumentTypeError("is empty: give a path (use . for the working folder)")
    if "\x00" in text:
        raise argparse.ArgumentTypeError(f"{text!r} holds a NUL byte, which no path can")
    return Path(text)


__all__ = [
    "MODEL_FOLDER_FILES", "arg_float", "arg_int", "arg_path", "check_choice", "check_count", "check_float", "check_int",
    "check_output_file", "check_output_folder", "check_top_k", "is_model_folder", "range_text",
]


def four_numbers(values: Any, what: str, hint: str, error: type[UserInputError] = UserInputError) -> list[float]:
    """A box's four finite numbers (a sequence, tensor or array), else one `error` saying what was wrong
    with `what` and how to fix it (`hint`)."""
    try:
        numbers = [float(v) for v in (values.tolist() if hasattr(values, "tolist") else values)]
    except (TypeError, ValueError):
        raise error(f"{what} {values!r} is not four numbers: {hint}") from None
    if len(numbers) != 4:
        raise error(f"{what} {values!r} has {len(numbers)} numbers, not 4: {hint}")
    if not all(math.isfinite(v) for v in numbers):
        raise error(f"{what} {numbers} holds NaN or infinity: {hint}")
    return numbers

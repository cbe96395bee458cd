"""What a result read back from a file must look like: every field of its declared type and shape.

`vlens.load_result` and `Result.load` read files a user may have edited, truncated or written with another
version. One mechanism checks every kind, declared by each `Result` subclass itself:

- its dataclass fields' annotations: ``int``, ``float`` (where JSON null, a saved NaN, is allowed; an ``int``
  never is), ``str``, ``bool``, ``X | None``, ``list[X]``,
  ``tuple[...]``, ``dict[K, V]``, classes, and jaxtyping tensors (``Float[Tensor, "n_layers n_cells"]``:
  dtype and shape, each named dimension the same size in every field that names it);
- ``saved_dims`` (a `ClassVar`): the named dimension that the length of a list field is, e.g.
  ``{"layers": "n_layers", "pair_ids": "n_pairs"}``, so that a list and the tensors it labels agree.

`check_fields(result, source)` raises `UserInputError` naming the first field that does not fit (a JSON
null where a number is needed, a string where an int is, a grid with a row missing, ...). `load_result`
also refuses a file whose fields are missing or do not fit together (the reader's KeyError / TypeError)
and one whose result does not write back what the file holds (`first_difference`).
"""

from __future__ import annotations

import dataclasses
import math
import sys
import types
import typing
from typing import Any

from vlens.utils.errors import UserInputError

FLOAT_TOLERANCE = 1e-6  # relative: a float32 tensor read from JSON doubles writes back within this


def _describe(value: Any) -> str:
    shape = getattr(value, "shape", None)
    if shape is not None and hasattr(value, "dtype"):
        return f"a {str(value.dtype).removeprefix('torch.')} tensor of shape {list(shape)}"
    if value is None:
        return "null (JSON null: a missing or NaN value)"
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 40 else text[:37] + '...'}"


def _resolve(annotation: Any, module: str) -> Any:
    """An annotation (a string under ``from __future__ import annotations``) as an object; None when it
    names something the module only imports for type checking (then the field is not checked)."""
    if not isinstance(annotation, str):
        return annotation
    namespace = dict(vars(sys.modules[module])) if module in sys.modules else {}
    try:
        return eval(annotation, namespace)  # noqa: S307 - the module's own annotation text
    except Exception:  # a name under TYPE_CHECKING only
        return None


def _is_jaxtyping(annotation: Any) -> bool:
    return hasattr(annotation, "dim_str") and hasattr(annotation, "dtypes")


def _mismatch(value: Any, annotation: Any) -> str | None:
    """Why `value` is not of `annotation` (None: it is, or the annotation is not checked here)."""
    if annotation is None or annotation is Any or annotation is object or isinstance(annotation, typing.TypeVar):
        return None
    if annotation is type(None):
        return None if value is None else f"must be null, got {_describe(value)}"
    if _is_jaxtyping(annotation):
        if isinstance(value, annotation):
            return None
        kind = "integer" if "int64" in annotation.dtypes else "floating-point" if "float32" in annotation.dtypes else ""
        return (f"must be a {kind} tensor of shape [{annotation.dim_str.strip()}] (each named size as in the "
                f"other fields), got {_describe(value)}").replace("a  tensor", "a tensor")
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        problems = [_mismatch(value, member) for member in args]
        return None if any(p is None for p in problems) else next(p for p in problems if p)
    if origin is typing.Literal:
        return None if value in args else f"must be one of {', '.join(map(repr, args))}, got {_describe(value)}"
    if annotation is bool:
        return None if isinstance(value, bool) else f"must be true or false, got {_describe(value)}"
    if annotation is int:  # (a bool is an int, as for Python's type checkers)
        return None if isinstance(value, int) else f"must be an integer, got {_describe(value)}"
    if annotation is float:  # JSON null is how a NaN is saved: allowed where the type is a float
        return None if value is None or isinstance(value, (int, float)) else f"must be a number, got {_describe(value)}"
    if annotation is str:
        return None if isinstance(value, str) else f"must be text, got {_describe(value)}"
    if origin in (list, tuple, typing.Sequence, set, frozenset) or annotation in (list, tuple):
        if not isinstance(value, (list, tuple, set, frozenset)):
            return f"must be a list, got {_describe(value)}"
        if origin is tuple and args and args[-1] is not Ellipsis:
            if len(value) != len(args):
                return f"must hold {len(args)} values, got {len(value)}"
            items = list(zip(value, args, strict=True))
        else:
            items = [(item, args[0]) for item in value] if args else []
        for i, (item, expected) in enumerate(items):
            problem = _mismatch(item, expected)
            if problem:
                return f"[{i}] {problem}"
        return None
    if origin in (dict, typing.Mapping) or annotation is dict:
        if not isinstance(value, dict):
            return f"must be an object {{key: value}}, got {_describe(value)}"
        if len(args) == 2:
            for key, item in value.items():
                problem = _mismatch(key, args[0]) or _mismatch(item, args[1])
                if problem:
                    return f"[{key!r}] {problem}"
        return None
    if isinstance(annotation, type):
        if annotation.__module__ == "torch" and annotation.__name__ == "Tensor":
            return None if hasattr(value, "shape") and hasattr(value, "dtype") else f"must be a tensor, got {_describe(value)}"
        return None if isinstance(value, annotation) else f"must be a {annotation.__name__}, got {_describe(value)}"
    return None  # Callable, protocols, ...: not checked


def check_fields(result: Any, source: str) -> None:
    """Every dataclass field of `result` fits its annotation, and the lengths in its ``saved_dims`` agree with
    the tensors' named dimensions (see the module doc); `UserInputError` naming the field otherwise."""
    if not dataclasses.is_dataclass(result):
        return
    import jaxtyping  # here: results that hold no tensor never need it
    import torch

    cls = type(result)
    with jaxtyping.jaxtyped("context"):  # one binding of every named dimension across the fields
        for name, dim in getattr(cls, "saved_dims", {}).items():
            value = getattr(result, name, None)
            if value is None:
                continue
            if not isinstance(value, (list, tuple)):
                raise UserInputError(f"{source}: the field {name!r} must be a list, got {_describe(value)}")
            shaped: Any = jaxtyping.Shaped[torch.Tensor, dim]
            if not isinstance(torch.empty(len(value)), shaped):
                raise UserInputError(f"{source}: the field {name!r} holds {len(value)} entries, which disagrees with "
                                     f"the other fields' {dim}")
        for field in dataclasses.fields(result):
            annotation = _resolve(field.type, cls.__module__) if isinstance(field.type, str) else field.type
            problem = _mismatch(getattr(result, field.name, None), annotation)
            if problem:
                raise UserInputError(f"{source}: the field {field.name!r} {problem}")
    for field in dataclasses.fields(result):  # parts that are dataclasses themselves (a taxonomy's scores)
        part = getattr(result, field.name, None)
        if dataclasses.is_dataclass(part) and not isinstance(part, type):
            check_fields(part, f"{source} {field.name}")


def differences(saved: dict, written: dict) -> list[str]:
    """Every top-level key whose value `written` does not give back as `saved` holds it (`first_difference`)."""
    return [found for key in saved if key in written
            for found in [first_difference(saved[key], written[key], str(key))] if found is not None]


def first_difference(saved: Any, written: Any, path: str = "") -> str | None:
    """The key path where `written` (what the loaded result writes back) differs from `saved` (None: they agree;
    floats within `FLOAT_TOLERANCE`, keys of `written` that `saved` lacks ignored: defaults of older files)."""
    if isinstance(saved, dict) and isinstance(written, dict):
        for key, value in saved.items():
            if key not in written:
                continue
            found = first_difference(value, written[key], f"{path}.{key}" if path else str(key))
            if found is not None:
                return found
        return None
    if isinstance(saved, (list, tuple)) and isinstance(written, (list, tuple)):
        if len(saved) != len(written):
            return path or "(the result)"
        for i, (a, b) in enumerate(zip(saved, written, strict=True)):
            found = first_difference(a, b, f"{path}[{i}]")
            if found is not None:
                return found
        return None
    numbers = (int, float)
    if (isinstance(saved, numbers) and isinstance(written, numbers) and not isinstance(saved, bool)
            and not isinstance(written, bool)):
        if saved == written or (math.isnan(float(saved)) and math.isnan(float(written))):
            return None
        return None if math.isclose(saved, written, rel_tol=FLOAT_TOLERANCE, abs_tol=1e-12) else path
    return None if saved == written and type(saved) is type(written) else path or "(the result)"


def failing_field(error: BaseException, data: dict) -> str | None:
    """The top-level key of `data` a reader was reading when it raised `error` (None: not found): a key
    written in the failing expression (``data["k"]``), else a key held by a local variable of the failing
    frame (a loop over names), searched from the innermost frame of vlens's own code outwards."""
    import linecache
    import re
    import traceback

    frames = [frame for frame in traceback.extract_tb(error.__traceback__)
              if "/vlens/" in frame.filename.replace("\\", "/") and "/site-packages/" not in frame.filename]
    tb, locals_by_frame = error.__traceback__, []
    while tb is not None:
        locals_by_frame.append((tb.tb_frame.f_code.co_filename, tb.tb_lineno, dict(tb.tb_frame.f_locals)))
        tb = tb.tb_next
    for frame in reversed(frames):
        end = getattr(frame, "end_lineno", None) or frame.lineno or 0  # positions: Python 3.11+
        lines = [linecache.getline(frame.filename, n) for n in range(frame.lineno or 0, end + 1)]
        text = "".join(lines)
        start_col, end_col = getattr(frame, "colno", None), getattr(frame, "end_colno", None)
        if start_col is not None and end_col is not None and len(lines) == 1:
            text = lines[0][start_col:end_col]
        for key in re.findall(r"[\"']([A-Za-z_][\w.]*)[\"']", text):
            if key in data:
                return key
        for filename, lineno, names in reversed(locals_by_frame):
            if filename == frame.filename and lineno == frame.lineno:
                # a local holding one of the file's lists / objects, or the name of a key
                held = [k for k in data for v in names.values() if isinstance(v, (list, dict)) and v is data[k]]
                values = [v for v in names.values() if isinstance(v, str)]
                joined = [a + b for a in values for b in values if a + b in data]  # data[prefix + name]
                found = (held or joined or [v for v in values if v in data]
                         or [k for k in data for v in values if k.endswith(f"_{v}")])
                if found:
                    return found[0]
    if isinstance(error, KeyError) and error.args:  # a value looked up as a key: the field that holds it
        held = [k for k, v in data.items() if not isinstance(v, (bool, list, dict)) and v == error.args[0]]
        if held:
            return held[0]
    return None


__all__ = ["check_fields", "differences", "failing_field", "first_difference"]

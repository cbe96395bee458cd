"""What a result read back from a file must look like: every field of its declared type and shape.

`vlens.load_result` and `Result.load` read files a user may have edited, truncated or written with another
version. One mechanism checks every kind, declared by each `Result` subclass itself:

- its dataclass fields' annotations: ``int``, ``float`` (where JSON null, a saved NaN, is allowed; an ``int``
  never is), ``str``, ``bool``, ``X | None``, ``list[X]``,
  ``tuple[...]``, ``dict[K, V]``, record schemas (a ``TypedDict``: each key's type, the required keys present; named
  by the path into the file, ``nodes[3].name``), classes, and jaxtyping tensors (``Float[Tensor, "n_layers n_cells"]``:
  dtype and shape, each named dimension the same size in every field that names it);
- ``saved_dims`` (a `ClassVar`): the named dimension that the length of a list field is, e.g.
  ``{"layers": "n_layers", "pair_ids": "n_pairs"}``, so that a list and the tensors it labels agree; an integer
  field there is the size itself (``{"n": "n_examples"}``), and ``"name[*]"`` sizes every list the field holds
  (``{"maps[*]": "n_images"}``: under each method, one map per image).

`check_fields(result, source)` raises `UserInputError` naming the first field that does not fit (a JSON
null where a number is needed, a string where an int is, a grid with a row missing, ...). `load_result`
also refuses a file whose fields are missing or do not fit together (the reader's KeyError / TypeError)
and one whose result does not write back what the file holds (`first_difference`).
"""

from __future__ import annotations

import ast
import dataclasses
import dis
import functools
import itertools
import linecache
import math
import re
import sys
import sysconfig
import textwrap
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


def _key_path(key: Any) -> str:
    """How a key of an object extends a path into the file: ``.name`` (``nodes[3].name``), ``[3]`` for a number."""
    return f".{key}" if isinstance(key, (str, int)) else f"[{key!r}]"  # (JSON keys are text: "0" is .0)


@functools.cache  # (a schema is read once per record of a file otherwise)
def record_fields(record: Any) -> dict[str, Any]:
    """The keys of a record schema (a ``TypedDict``) and their annotations, resolved in the schema's module."""
    try:
        return typing.get_type_hints(record)
    except Exception:  # a name under TYPE_CHECKING only: each annotation resolved alone (unresolved: not checked)
        return {key: _resolve(value, record.__module__) for key, value in record.__annotations__.items()}


def _mismatch(value: Any, annotation: Any) -> tuple[str, str] | None:
    """Where inside `value` and why it is not of `annotation`: (the path below the field, ``[3].name`` or ""; the
    problem); None: it is, or the annotation is not checked here."""
    if annotation is None or annotation is Any or annotation is object or isinstance(annotation, typing.TypeVar):
        return None
    if annotation is type(None):
        return None if value is None else ("", f"must be null, got {_describe(value)}")
    if _is_jaxtyping(annotation):
        if isinstance(value, annotation):
            return None
        dtypes = annotation.dtypes if isinstance(annotation.dtypes, (list, tuple)) else ()  # (Shaped: any dtype)
        kind = "integer" if "int64" in dtypes else "floating-point" if "float32" in dtypes else ""
        return "", (f"must be a {kind} tensor of shape [{annotation.dim_str.strip()}] (each named size as in the "
                    f"other fields), got {_describe(value)}").replace("a  tensor", "a tensor")
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        problems = [_mismatch(value, member) for member in args]
        if any(p is None for p in problems):
            return None
        # the member the value is closest to: the one whose problem lies deepest inside it (a record's key)
        return max((p for p in problems if p), key=lambda p: len(p[0]))
    if origin is typing.Literal:
        return None if value in args else ("", f"must be one of {', '.join(map(repr, args))}, got {_describe(value)}")
    if typing.is_typeddict(annotation):  # a record: an object with these keys (`record_fields`)
        if not isinstance(value, dict):
            return "", f"must be an object {{key: value}} with keys {', '.join(record_fields(annotation))}, got {_describe(value)}"
        for key in sorted(annotation.__required_keys__, key=list(record_fields(annotation)).index):
            if key not in value:
                return _key_path(key), "is missing"
        for key, expected in record_fields(annotation).items():
            problem = _mismatch(value[key], expected) if key in value else None
            if problem:
                return _key_path(key) + problem[0], problem[1]
        return None
    if annotation is bool:
        return None if isinstance(value, bool) else ("", f"must be true or false, got {_describe(value)}")
    if annotation is int:  # (a bool is an int, as for Python's type checkers)
        return None if isinstance(value, int) else ("", f"must be an integer, got {_describe(value)}")
    if annotation is float:  # JSON null is how a NaN is saved: allowed where the type is a float
        return (None if value is None or isinstance(value, (int, float))
                else ("", f"must be a number, got {_describe(value)}"))
    if annotation is str:
        return None if isinstance(value, str) else ("", f"must be text, got {_describe(value)}")
    if origin in (list, tuple, typing.Sequence, set, frozenset) or annotation in (list, tuple):
        if not isinstance(value, (list, tuple, set, frozenset)):
            return "", f"must be a list, got {_describe(value)}"
        if origin is tuple and args and args[-1] is not Ellipsis:
            if len(value) != len(args):
                return "", f"must hold {len(args)} values, got {len(value)}"
            items = list(zip(value, args, strict=True))
        else:
            items = [(item, args[0]) for item in value] if args else []
        for i, (item, expected) in enumerate(items):
            problem = _mismatch(item, expected)
            if problem:
                return f"[{i}]{problem[0]}", problem[1]
        return None
    if origin in (dict, typing.Mapping) or annotation is dict:
        if not isinstance(value, dict):
            return "", f"must be an object {{key: value}}, got {_describe(value)}"
        if len(args) == 2:
            for key, item in value.items():
                problem = _mismatch(key, args[0])
                if problem:
                    return _key_path(key), f"is a key that {problem[1]}"
                problem = _mismatch(item, args[1])
                if problem:
                    return _key_path(key) + problem[0], problem[1]
        return None
    if isinstance(annotation, type):
        if annotation.__module__ == "torch" and annotation.__name__ == "Tensor":
            return (None if hasattr(value, "shape") and hasattr(value, "dtype")
                    else ("", f"must be a tensor, got {_describe(value)}"))
        return None if isinstance(value, annotation) else ("", f"must be a {annotation.__name__}, got {_describe(value)}")
    return None  # Callable, protocols, ...: not checked


def check_fields(result: Any, source: str, prefix: str = "") -> None:
    """Every dataclass field of `result` fits its annotation, and the lengths in its ``saved_dims`` agree with
    the tensors' named dimensions (see the module doc); `UserInputError` naming the field otherwise, as a path
    into the file (`prefix`: where `result` is, for a part that is a dataclass itself: ``results.counting.``)."""
    if not dataclasses.is_dataclass(result):
        return
    import jaxtyping  # here: results that hold no tensor never need it
    import torch

    try:
        _check_own_fields(result, source, jaxtyping, torch, prefix)
    except UserInputError as error:
        # the first field read binds each named size: the one that disagrees with most others is the one to name
        sizes = "which disagrees with" in str(error) or "tensor of shape" in str(error)
        odd = _odd_size(result) if sizes else None  # (a value of another type is said as it is)
        if odd is None or (len(odd) == 4 and f"the field {_label(result, prefix, odd[0])!r}" in str(error)):
            raise
        if len(odd) == 2:  # as many fields give one size as another: any of them may be the edited one
            dim, groups = odd
            said = " and ".join(f"{', '.join(repr(_label(result, prefix, n)) for n in names)} ({dim} = {size})"
                                for size, names in groups.items())
            raise UserInputError(f"{source}: the fields {said} disagree") from None
        name, dim, size, usual = odd
        if name in _declared_names(type(result)):
            raise UserInputError(f"{source}: the field {_label(result, prefix, name)!r} holds {size} entries, which "
                                 f"disagrees with the other fields' {dim} ({usual})") from None
        raise UserInputError(f"{source}: the field {_label(result, prefix, name)!r} has {dim} = {size}, which disagrees with the other fields' "
                             f"{dim} = {usual}") from None
    for field in dataclasses.fields(result):  # parts that are dataclasses themselves (a taxonomy's scores)
        part, name = getattr(result, field.name, None), saved_key(result, field.name)
        parts = ([(f"{name}.{key}", item) for key, item in part.items()] if isinstance(part, dict)
                 else [(f"{name}[{i}]", item) for i, item in enumerate(part)] if isinstance(part, (list, tuple))
                 else [(name, part)])
        for label, item in parts:  # (an ablation report's per-task head ablations too)
            if dataclasses.is_dataclass(item) and not isinstance(item, type):
                check_fields(item, source, f"{prefix}{label}.")


def _declared_names(cls: type) -> set[str]:
    return set(getattr(cls, "saved_dims", {})) | {key.removesuffix("[*]") for key in getattr(cls, "saved_dims", {})}


def _declared_sizes(result: Any) -> list[tuple[str, str, int | str]]:
    """(field, named dimension, its size, or why it has none) of each entry of the class's ``saved_dims``: a list
    field's length, an integer field's value, or with ``"name[*]"`` the length of every list the field holds (a
    dict's values or a list's items: ``{"maps[*]": "n_images"}``, one list per image under each method). A field
    with a default that holds an empty list is not sized (files written before it existed)."""
    found: list[tuple[str, str, int | str]] = []
    defaulted = {f.name for f in dataclasses.fields(result)
                 if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING}
    for key, dim in getattr(type(result), "saved_dims", {}).items():
        name = key.removesuffix("[*]")
        value = getattr(result, name, None)
        if value is None or (name in defaulted and isinstance(value, (list, tuple, dict)) and not value):
            continue  # not recorded (a file of a version before the field: its default, empty)
        if key == name:
            items = [(name, value)]
        elif isinstance(value, dict):
            items = [(f"{name}.{k}", item) for k, item in value.items()]
        elif isinstance(value, (list, tuple)):
            items = [(f"{name}[{i}]", item) for i, item in enumerate(value)]
        else:
            items = [(name, value)]
        for label, item in items:
            if isinstance(item, int) and not isinstance(item, bool) and key == name:
                # an integer field that is the size itself (a sweep's `n`)
                found.append((label, dim, item if item >= 0 else f"must be 0 or more, got {item}"))
            elif isinstance(item, (list, tuple)):
                found.append((label, dim, len(item)))
            else:
                found.append((label, dim, f"must be a list, got {_describe(item)}"))
    return found


def _sizes(result: Any) -> list[tuple[str, list[tuple[str, int]]]]:
    """(field, [(named dimension, its size)]) of every list in ``saved_dims`` and every tensor field annotated with
    a jaxtyping shape (also inside a dict or list field: ``metrics.overwrite_rate``), in the order declared."""
    cls = type(result)
    found: list[tuple[str, list[tuple[str, int]]]] = []
    found.extend((label, [(dim, size)]) for label, dim, size in _declared_sizes(result) if isinstance(size, int))
    for field in dataclasses.fields(result):
        annotation = _resolve(field.type, cls.__module__) if isinstance(field.type, str) else field.type
        value = getattr(result, field.name, None)
        candidates = [(field.name, annotation, value)]
        args = [a for a in typing.get_args(annotation) if _is_jaxtyping(a)]
        if isinstance(value, dict) and args:
            candidates = [(f"{field.name}.{key}", args[-1], item) for key, item in value.items()]
        elif isinstance(value, (list, tuple)) and args:
            candidates = [(f"{field.name}[{i}]", args[-1], item) for i, item in enumerate(value)]
        elif typing.get_origin(annotation) in (typing.Union, types.UnionType):
            candidates = [(field.name, next((a for a in typing.get_args(annotation) if _is_jaxtyping(a)), None), value)]
        for label, shaped, tensor in candidates:
            shape = getattr(tensor, "shape", None)
            if shaped is None or shape is None or not _is_jaxtyping(shaped):
                continue
            dims = shaped.dim_str.split()
            if len(dims) != len(shape) or any(not d.isidentifier() or d == "_" for d in dims):
                continue  # a variadic or fixed dimension: not compared here
            found.append((label, list(zip(dims, map(int, shape), strict=True))))
    return found


def _odd_size(result: Any) -> tuple[str, str, int, int] | tuple[str, dict[int, list[str]]] | None:
    """(field, dimension, its size there, the size most fields give it) of the first field whose size of a named
    dimension is not the one most fields agree on; (dimension, {size: fields}) when no size has more fields than
    another; None: every size agrees."""
    from collections import Counter

    sized = _sizes(result)
    votes: dict[str, Counter] = {}
    holders: dict[str, dict[int, list[str]]] = {}
    for name, dims in sized:
        for dim, size in dims:
            votes.setdefault(dim, Counter())[size] += 1
            holders.setdefault(dim, {}).setdefault(size, []).append(name)
    for name, dims in sized:
        for dim, size in dims:
            common = votes[dim].most_common(2)
            if len(common) > 1 and common[0][1] == common[1][1]:
                return dim, holders[dim]
            if common[0][0] != size:
                return name, dim, size, common[0][0]
    return None


def _check_own_fields(result: Any, source: str, jaxtyping: Any, torch: Any, prefix: str = "") -> None:
    cls = type(result)
    with jaxtyping.jaxtyped("context"):  # one binding of every named dimension across the fields
        for name, dim, size in _declared_sizes(result):
            if isinstance(size, str):
                raise UserInputError(f"{source}: the field {_label(result, prefix, name)!r} {size}")
            shaped: Any = jaxtyping.Shaped[torch.Tensor, dim]
            if not isinstance(torch.empty(size, device="meta"), shaped):  # (no memory, whatever the size)
                raise UserInputError(f"{source}: the field {_label(result, prefix, name)!r} holds {size} entries, "
                                     f"which disagrees with the other fields' {dim}")
        for field in dataclasses.fields(result):
            annotation = _resolve(field.type, cls.__module__) if isinstance(field.type, str) else field.type
            problem = _mismatch(getattr(result, field.name, None), annotation)
            if problem:
                raise UserInputError(f"{source}: the field {_label(result, prefix, field.name) + problem[0]!r} {problem[1]}")


def _label(result: Any, prefix: str, path: str) -> str:
    """`path` (a field, ``maps.x``, ``nodes[3]``) of `result` as a path into the file: under `prefix`, its field
    named by the key the file holds it under (`saved_key`)."""
    head = re.match(r"[^.\[]*", path)
    name = head.group(0) if head else path
    return prefix + saved_key(result, name) + path[len(name):]


def saved_key(result: Any, name: str) -> str:
    """The key of the file that field `name` of `result` is read from: the class's ``saved_key(name)`` where it
    saves a field under another key (a patching result's cells are its "regions", "positions", ...), else `name`."""
    rename = getattr(result, "saved_key", None)
    return rename(name) if callable(rename) else name


def annotation_of(cls: type, field: dataclasses.Field) -> Any:
    """The annotation of a dataclass field of `cls` as an object (None: not resolvable here, so not checked)."""
    return _resolve(field.type, cls.__module__) if isinstance(field.type, str) else field.type


def fits(value: Any, annotation: Any) -> bool:
    """Whether `value` (as read from JSON) is of `annotation`, as `check_fields` decides it."""
    return _mismatch(value, annotation) is None


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


def json_misfit(cls: type, data: dict) -> tuple[str, str] | None:
    """The first key of `data` that names a dataclass field of `cls` and holds a JSON value that no saved form of
    the field's annotation can be (a text where a list or number is needed, ...), with why; None: none found.
    Only the kind of JSON value is compared (a tuple is saved as a list, a dataclass as an object; tensors and
    other classes, saved in many forms, are not compared), so a value a reader converts is not taken for one."""
    fields = {field.name: field for field in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else {}
    for key, value in data.items():
        field = fields.get(key)
        if field is None:
            continue
        annotation = _resolve(field.type, cls.__module__) if isinstance(field.type, str) else field.type
        kinds = _json_kinds(annotation)
        if kinds is not None and not isinstance(value, kinds):
            names = sorted({JSON_NAMES[kind] for kind in kinds})
            return key, f"must be {' or '.join(names)}, got {_describe(value)}"
    return None


JSON_NAMES = {list: "a list", dict: "an object {key: value}", str: "text", bool: "true or false", int: "a number",
              float: "a number", type(None): "null"}


def _json_kinds(annotation: Any) -> tuple[type, ...] | None:
    """The Python types of the JSON values a field of `annotation` may be saved as (None: any, or not known)."""
    if annotation is None or annotation is Any or annotation is object or isinstance(annotation, typing.TypeVar):
        return None
    if annotation is type(None):
        return (type(None),)
    if _is_jaxtyping(annotation) or (isinstance(annotation, type) and annotation.__module__ == "torch"
                                     and annotation.__name__ == "Tensor"):
        return None  # nested lists, a number, or an object per label ({region: count}): its reader knows
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        members = [_json_kinds(member) for member in typing.get_args(annotation)]
        return None if any(m is None for m in members) else tuple({kind for m in members for kind in m or ()})
    if origin is typing.Literal:
        return tuple({type(arg) for arg in typing.get_args(annotation)})
    if annotation is float:
        return (int, float, type(None))  # null: a saved NaN
    if annotation in (bool, int, str):
        return (annotation,)
    if origin in (list, tuple, typing.Sequence, set, frozenset) or annotation in (list, tuple, set, frozenset):
        return (list,)
    if origin in (dict, typing.Mapping) or annotation is dict:
        return (dict,)
    if typing.is_typeddict(annotation) or (isinstance(annotation, type) and dataclasses.is_dataclass(annotation)):
        return (dict,)
    return None  # other classes (paths, images, ...): whatever their reader takes


def failing_field(error: BaseException, data: dict) -> str | None:
    """The field of `data` a reader was reading when it raised `error`, as a path into the file (``edges``,
    ``nodes[3].layer``); None: not found. The first of `failing_paths`."""
    paths = failing_paths(error, data)
    return paths[0] if paths else None


def failing_paths(error: BaseException, data: dict) -> list[str]:
    """The fields of `data` (paths into the file) a reader was reading when it raised `error`: one, or the few one
    failing expression read (``zip(data["a"], data["b"])``); empty: not found.

    Searched from the innermost frame of vlens's own code outwards, in the expression that failed: a key read from
    a value of the file (``node["layer"]``, ``data.get("edges")``, ``data[prefix + name]``), else a local named
    there that holds a list or object of the file (found by identity, so that a copy of the file's dict counts as
    it) or a text of the file that no other field holds."""
    where = _Locator(data)
    tb = error.__traceback__
    frames = []
    while tb is not None:
        filename = tb.tb_frame.f_code.co_filename.replace("\\", "/")
        if _readers_code(filename):
            frames.append(tb)
        tb = tb.tb_next
    for tb in reversed(frames):
        found = _paths_in_frame(tb, where, data)
        if found and isinstance(error, KeyError) and error.args and isinstance(error.args[0], str):
            key = error.args[0]  # of the keys the expression read, the one that failed
            found = [p for p in found if p == key or p.endswith(f".{key}")] or found
        if found:
            return found
    if isinstance(error, KeyError) and error.args:  # a value looked up as a key: the field that holds it
        held = [k for k, v in data.items() if not isinstance(v, (bool, list, dict)) and v == error.args[0]]
        if held:
            return held[:1]
    return []


def _paths_in_frame(tb: types.TracebackType, where: _Locator, data: dict) -> list[str]:
    """The paths of the file that the expression a traceback entry failed in read (`failing_paths`)."""
    code = tb.tb_frame.f_code
    # a loop whose iterator failed (zip(..., strict=True)): its loop variables still hold the previous item
    iterating = 0 <= tb.tb_lasti < len(code.co_code) and dis.opname[code.co_code[tb.tb_lasti]] == "FOR_ITER"
    texts = _failing_texts(tb)
    found = where.named_in(texts[0], tb.tb_frame.f_locals, tb.tb_frame.f_globals, names_too=not iterating)
    if found or len(texts) == 1:
        return found
    if code.co_name == "to_dict":  # writing the result back: the key being written where it failed
        line = linecache.getline(code.co_filename, tb.tb_lineno)
        start = _position(tb)[2]
        keys = [k for k in re.findall(r"[\"'](\w+)[\"']\s*:", line[:start] if start is not None else line) if k in data]
        if keys:
            return keys[-1:]
    return where.named_in(texts[-1], tb.tb_frame.f_locals, tb.tb_frame.f_globals, names_too=False)


def _readers_code(filename: str) -> bool:
    """A file of vlens or of the project that defines a result (a plugin's kind too), not a library it calls."""
    filename = filename.replace("/dist-packages/", "/site-packages/")
    if "/site-packages/" in filename:
        return "/site-packages/vlens/" in filename
    return not filename.startswith(("<", sysconfig.get_paths()["stdlib"].replace("\\", "/")))


def _position(tb: types.TracebackType) -> tuple[int, int, int | None, int | None]:
    """First and last line and the columns of the expression a traceback entry failed in (columns: 3.11+)."""
    code, lasti = tb.tb_frame.f_code, tb.tb_lasti
    all_positions = getattr(code, "co_positions", None)
    positions = (next(itertools.islice(all_positions(), lasti // 2, None), None)
                 if all_positions is not None and lasti >= 0 else None)
    start, end, start_col, end_col = positions if positions else (tb.tb_lineno, tb.tb_lineno, None, None)
    start = start or tb.tb_lineno
    return start, end or start, start_col, end_col


def _failing_texts(tb: types.TracebackType) -> list[str]:
    """The source of the expression a traceback entry failed in (where Python records its columns), then of its
    whole line(s)."""
    start, end, start_col, end_col = _position(tb)
    lines = [linecache.getline(tb.tb_frame.f_code.co_filename, n) for n in range(start, end + 1)]
    texts = []
    if start_col is not None and end_col is not None:
        texts.append(lines[0][start_col:end_col] if len(lines) == 1 else
                     lines[0][start_col:] + "".join(lines[1:-1]) + lines[-1][:end_col])
    texts.append("".join(lines))
    return texts


class _Locator:
    """Where the values of a file's dict are: every list and object in it by identity, as a path."""

    def __init__(self, data: dict) -> None:
        self.data = data
        self.paths: dict[int, str] = {}
        texts: dict[int, list[str]] = {}
        stack: list[tuple[Any, str]] = [(value, str(key)) for key, value in data.items()]
        while stack:
            value, path = stack.pop()
            if isinstance(value, str) and value:
                texts.setdefault(id(value), []).append(path)
            elif isinstance(value, dict):
                self.paths.setdefault(id(value), path)
                stack.extend((item, f"{path}.{key}") for key, item in value.items())
            elif isinstance(value, list):
                self.paths.setdefault(id(value), path)
                stack.extend((item, f"{path}[{i}]") for i, item in enumerate(value))
        # a text held in one place only (a text object that recurs, like a one-letter one, says nothing)
        self.texts = {key: paths[0] for key, paths in texts.items() if len(paths) == 1}

    def path_of(self, value: Any) -> str | None:
        """The path of `value` in the file ("" for the file's dict or a copy of it); None: not one of its values."""
        if value is self.data:
            return ""
        if isinstance(value, (dict, list)):
            found = self.paths.get(id(value))
            if found is not None:
                return found
        if isinstance(value, dict):  # a copy of the file's dict (or of one of its objects): most values the same
            for original, path in [(self.data, ""), *((v, str(k)) for k, v in self.data.items() if isinstance(v, dict))]:
                shared = [k for k in value if k in original]
                if shared and 2 * sum(value[k] is original[k] for k in shared) >= len(shared) + 1:
                    return path
        if isinstance(value, str) and value:  # a text of the file that no other value is
            return self.texts.get(id(value))
        return None

    def named_in(self, text: str, names: dict[str, Any], constants: dict[str, Any], names_too: bool = True) -> list[str]:
        """The paths `text` (a failing expression) reads: keys read from the file's values, else (`names_too`) its
        locals that are values of the file. constants: the module's names (``data[CELL_AXIS[mode]]``)."""
        found: list[str] = []
        for base, key in _reads(text, {**constants, **names}):
            path = self.path_of(base)
            if path is None:
                continue
            if path == "" and key in ("kind", "provenance"):
                continue
            if isinstance(base, dict) and isinstance(key, str):
                found.append(f"{path}.{key}" if path else key)
            elif isinstance(base, list) and isinstance(key, int) and not isinstance(key, bool):
                found.append(f"{path}[{key}]")
            elif path:  # a text, or a list read as an object: the value itself is of another kind
                found.append(path)
        if not found and names_too:
            for name in re.findall(r"\b[A-Za-z_]\w*\b", text):
                if name in names and name not in ("self", "cls"):
                    path = self.path_of(names[name])
                    if path:
                        found.append(path)
        unique = list(dict.fromkeys(found))
        return unique if len(unique) <= 3 else []  # more: an expression over the whole file, no one field


def _reads(text: str, names: dict[str, Any]) -> list[tuple[Any, Any]]:
    """(value, key) of every ``value[key]``, ``value.get(key ...)`` and ``value.pop(key ...)`` in `text` whose value
    and key are locals, constants or sums of them (``data[prefix + name]``), in the order written."""
    try:
        tree = ast.parse(textwrap.dedent(text).strip(), mode="eval")
    except SyntaxError:  # a part of a statement: the quoted keys read from a local
        return [(names[base], key) for base, key in re.findall(r"\b([A-Za-z_]\w*)\s*(?:\[|\.get\(|\.pop\()\s*[\"']([^\"']+)[\"']", text)
                if base in names]
    reads = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript):
            reads.append((node.value, node.slice))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("get", "pop")
              and node.args):
            reads.append((node.func.value, node.args[0]))
    out = []
    for base, key in sorted(reads, key=lambda pair: (pair[0].lineno, pair[0].col_offset)):
        value, index = _simple(base, names), _simple(key, names)
        if value is not _UNKNOWN and index is not _UNKNOWN:
            out.append((value, index))
    return out


_UNKNOWN = object()


def _simple(node: ast.AST, names: dict[str, Any]) -> Any:
    """The value of a local, a constant, ``local.attribute`` or a sum of texts (_UNKNOWN: anything else)."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        return names.get(node.id, _UNKNOWN)
    if isinstance(node, ast.Attribute):
        owner = _simple(node.value, names)
        if owner is _UNKNOWN or not dataclasses.is_dataclass(owner):  # a field, never a property that computes
            return _UNKNOWN
        return owner.__dict__.get(node.attr, _UNKNOWN)
    if isinstance(node, ast.Subscript):  # a module's table of keys (never a class's own __getitem__)
        table, key = _simple(node.value, names), _simple(node.slice, names)
        if isinstance(table, dict) and not isinstance(key, (dict, list)) and key is not _UNKNOWN:
            return table.get(key, _UNKNOWN)
        return _UNKNOWN
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _simple(node.left, names), _simple(node.right, names)
        return left + right if isinstance(left, str) and isinstance(right, str) else _UNKNOWN
    return _UNKNOWN


__all__ = ["annotation_of", "check_fields", "differences", "failing_field", "failing_paths", "first_difference", "fits",
           "json_misfit", "record_fields", "saved_key"]

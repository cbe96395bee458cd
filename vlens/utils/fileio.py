"""Writing output folders and files so that a failure never leaves a half-written or mixed result.

`atomic_folder(target)`: write a whole folder (a model, an adapter, a lens) into a hidden
temporary sibling and rename it onto `target` only when the block finishes; an exception or
a kill leaves the previous `target` exactly as it was (the temporary folder is removed on an
exception; after a kill, a hidden ``.<name>.tmp-*`` folder may remain beside it). Replacing an
existing model folder needs ``overwrite=True``; a non-empty folder that is not a model folder is
never replaced (its files are the user's).

`atomic_write_text(path, text)` / `atomic_write_json(path, data)` / `atomic_write(path, write)`: the
same for one file (temporary sibling, fsync, `os.replace`): a reader sees the old file or the new
one, never a 0-byte or truncated one.

`read_json_file(path, what)`: a JSON file read strictly (`loads_strict`: a repeated key is refused);
an empty, truncated or unreadable file is a `UserInputError` naming it and saying how to recover.

`load_tensor_file(path, what)`: ``torch.load(weights_only=True)``, so a downloaded or tampered
file never runs code; a file that holds anything but plain data (tensors, numbers, strings, lists
and dicts of them) or is truncated is a `UserInputError` naming it and how to regenerate it.
"""

from __future__ import annotations

import json
import os
import pickle
import re
import shutil
import uuid
import zipfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from vlens.utils.errors import UserInputError
from vlens.utils.strict_json import loads_strict
from vlens.utils.validation import check_output_folder


def _sibling(target: Path, kind: str) -> Path:
    return target.parent / f".{target.name}.{kind}-{uuid.uuid4().hex[:8]}"


@contextmanager
def atomic_folder(target: str | os.PathLike, overwrite: bool = False, name: str = "out") -> Iterator[Path]:
    """Yield a temporary folder; on success it replaces `target` in one rename.

    Raises `vlens.utils.errors.UserInputError` before anything is written when `target` is a file,
    not writable, an existing model folder without `overwrite`, or a non-empty non-model folder.
    """
    target = Path(target)
    check_output_folder(target, name, overwrite=overwrite, model_folder=True)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = _sibling(target, "tmp")
    staging.mkdir()
    try:
        yield staging
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    if target.exists():
        old = _sibling(target, "old")
        target.rename(old)
        try:
            staging.rename(target)
        except BaseException:
            old.rename(target)  # put the previous folder back
            raise
        shutil.rmtree(old, ignore_errors=True)
    else:
        staging.rename(target)


def atomic_write(path: str | os.PathLike, write: Callable[[Path], Any]) -> Path:
    """Call `write(temporary)` for a temporary file beside `path`, flush it to disk (fsync) and
    rename it onto `path` in one step; on any failure `path` is left as it was."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = _sibling(path, "tmp")
    try:
        write(staging)
        with open(staging, "rb+") as handle:  # the bytes reach the disk before the name does
            os.fsync(handle.fileno())
        os.replace(staging, path)
    except BaseException:
        staging.unlink(missing_ok=True)
        raise
    return path


def atomic_write_text(path: str | os.PathLike, text: str, encoding: str = "utf-8") -> Path:
    """Write `text` to `path` atomically (`atomic_write`)."""
    return atomic_write(path, lambda staging: staging.write_text(text, encoding=encoding))


def atomic_write_json(path: str | os.PathLike, data: Any, indent: int | None = 1, sort_keys: bool = False) -> Path:
    """Write `data` as JSON (one trailing newline) to `path` atomically (`atomic_write`)."""
    return atomic_write_text(path, json.dumps(data, indent=indent, sort_keys=sort_keys) + "\n")


def read_json_file(path: str | os.PathLike, what: str = "", fix: str = "") -> Any:
    """The JSON value in `path`, read strictly (a key repeated in one object is refused).

    Raises `UserInputError` naming the file (and `what` it is, e.g. "the --temps file") when it is
    missing, empty, truncated or not JSON; `fix` says how to recover (e.g. "delete it to start over")."""
    path = Path(path)
    label = f"{what} {path}" if what else str(path)
    tail = f"; {fix}" if fix else ""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UserInputError(f"{label} does not exist{tail}") from None
    except IsADirectoryError:
        raise UserInputError(f"{label} is a folder, not a JSON file{tail}") from None
    except (OSError, UnicodeDecodeError) as error:
        raise UserInputError(f"{label} cannot be read ({error}){tail}") from None
    if not text.strip():
        raise UserInputError(f"{label} is empty (0 bytes: a write that was interrupted?){tail}")
    try:
        return loads_strict(text, label)
    except json.JSONDecodeError as error:
        raise UserInputError(f"{label} is not valid JSON (line {error.lineno}: {error.msg}; truncated by an "
                             f"interrupted write?){tail}") from None


def load_tensor_file(path: str | os.PathLike, what: str = "", fix: str = "delete it and run again") -> Any:
    """``torch.load(path, map_location="cpu", weights_only=True)``: plain data only, never code.

    A file holding other objects (an old-format or planted pickle), or a truncated or empty one,
    raises `UserInputError` naming the file and saying `fix` (how to regenerate it)."""
    import torch  # here: most users of this module never load a tensor file

    path = Path(path)
    label = f"{what} {path}" if what else str(path)
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        found = re.search(r"Unsupported global: GLOBAL (\S+)", str(error))
        refused = f"it refers to {found.group(1)}" if found else "not plain data"
        raise UserInputError(
            f"{label} holds objects other than plain tensors and numbers, which vlens never unpickles (unpickling could "
            f"run code; {refused[:120]}); it was not written by this version of vlens or was tampered with: "
            f"{fix}") from None
    except (EOFError, RuntimeError, zipfile.BadZipFile, OSError) as error:
        raise UserInputError(f"{label} is empty, truncated or not a tensor file ({str(error)[:160]}): {fix}") from None


def check_float_tensors(tensors: dict[str, Any], source: str, fix: str = "") -> dict[str, Any]:
    """`tensors` unchanged when every one is floating point; else a `UserInputError` naming the first that
    is not (an integer or boolean weight would be cast to float without a word when copied into a module:
    a quantised checkpoint, a corrupted file, or one written by another tool)."""
    for name, tensor in tensors.items():
        if not getattr(tensor, "is_floating_point", lambda: True)():
            raise UserInputError(
                f"{source}: {name} is stored as {str(tensor.dtype).removeprefix('torch.')}, not floating point: vlens "
                "reads only float weights (a quantised, corrupted or foreign file would be silently cast)"
                + (f"; {fix}" if fix else "; write it again with float tensors (float32, float16 or bfloat16)"))
    return tensors


def load_float_tensors(path: str | os.PathLike, what: str, fix: str = "", device: str | None = None) -> dict[str, Any]:
    """A safetensors file's tensors, every one floating point (`check_float_tensors`; `what` names the file)."""
    from safetensors.torch import load_file  # here: most users of this module never load a tensor file

    return check_float_tensors(load_file(str(path), device=device or "cpu"), f"{what} {path}", fix)


__all__ = ["atomic_folder", "atomic_write", "atomic_write_json", "atomic_write_text", "check_float_tensors",
           "load_float_tensors", "load_tensor_file", "read_json_file"]

"""A model folder's weight files, read from their headers only (no tensor is loaded).

A safetensors file is 8 bytes (little-endian header length N), N bytes of JSON (per tensor:
dtype, shape, [begin, end) byte offsets into the data that follows), then the data. Reading
the header tells, for a file of any size and in milliseconds, whether the file is a safetensors
file at all, whether it is complete (the last tensor ends where the file does) and every
tensor's name and shape. `weight_tensors(folder)` does that for a folder's ``model.safetensors``
or the shards that ``model.safetensors.index.json`` names, and refuses folders that hold only
pickled weights (``pytorch_model.bin``, ``*.pt``), which vlens never unpickles.
"""

from __future__ import annotations

import errno
import json
import math
import os
import struct
from dataclasses import dataclass
from pathlib import Path

from vlens.utils.errors import UserInputError
from vlens.utils.strict_json import loads_strict

INDEX_FILE = "model.safetensors.index.json"
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
MAX_HEADER_BYTES = 100 * 2**20  # safetensors' own limit
DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U64": 8,
               "U32": 4, "U16": 2, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1, "C64": 8}
CONVERT_HINT = ("convert it once where you trust the file: `from safetensors.torch import save_file; "
                "save_file(torch.load('pytorch_model.bin', weights_only=True), 'model.safetensors', "
                "metadata={'format': 'pt'})` (or load it with transformers and save_pretrained)")


class ModelFolderError(UserInputError):
    """A model folder that cannot be used as it is; the message names the file and the fix."""


class WeightFileError(ModelFolderError):
    """A weight file is missing, unreadable, truncated or not safetensors; the message names it."""


@dataclass(frozen=True)
class TensorInfo:
    file: str  # the file's name inside the folder
    dtype: str
    shape: tuple[int, ...]


def read_header(path: Path) -> dict[str, TensorInfo]:
    """{tensor name: TensorInfo} from a safetensors file's header, checked against the file's size."""
    name = path.name
    try:
        size = path.stat().st_size
        with path.open("rb") as handle:
            prefix = handle.read(8)
            if len(prefix) < 8:
                raise WeightFileError(f"{path}: {size} bytes is too short for a safetensors file (truncated or "
                                      "empty): download or save the checkpoint again")
            (length,) = struct.unpack("<Q", prefix)
            if length > MAX_HEADER_BYTES or length > size - 8:
                raise WeightFileError(f"{path}: not a safetensors file, or cut short (its first bytes announce a "
                                      f"{length}-byte header in a {size}-byte file): download or save it again")
            raw = handle.read(length)
    except OSError as error:
        raise _os_error(error, path, "read") from None
    try:
        header = loads_strict(raw.decode("utf-8"), str(path))
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise WeightFileError(f"{path}: not a safetensors file (its header is not JSON): download or save the "
                              "checkpoint again") from None
    if not isinstance(header, dict):
        raise WeightFileError(f"{path}: not a safetensors file (its header is not a JSON object)")
    tensors, end = {}, 0
    data_bytes = size - 8 - length
    for key, entry in header.items():
        if key == "__metadata__":
            continue
        try:
            dtype, shape, (begin, stop) = str(entry["dtype"]), tuple(int(d) for d in entry["shape"]), \
                entry["data_offsets"]
            begin, stop = int(begin), int(stop)
        except (KeyError, TypeError, ValueError):
            raise WeightFileError(f"{path}: tensor {key!r} has a malformed header entry (dtype, shape, "
                                  "data_offsets): the file is corrupt") from None
        itemsize = DTYPE_BYTES.get(dtype)
        if begin < 0 or stop < begin or (itemsize is not None and stop - begin != math.prod(shape) * itemsize):
            raise WeightFileError(f"{path}: tensor {key!r} ({dtype} {list(shape)}) does not match its byte range "
                                  f"[{begin}, {stop}): the file is corrupt")
        end = max(end, stop)
        tensors[key] = TensorInfo(name, dtype, shape)
    if end > data_bytes:
        raise WeightFileError(f"{path}: truncated: its tensors need {end} bytes of data but the file holds "
                              f"{data_bytes} (an interrupted download or copy): download or save it again")
    if end < data_bytes:
        raise WeightFileError(f"{path}: {data_bytes - end} bytes after the last tensor: the file is corrupt "
                              "(or not a safetensors file): download or save it again")
    return tensors


def weight_files(folder: Path) -> list[Path]:
    """The safetensors files that hold the model's weights (the index's shards, or model.safetensors, or
    every *.safetensors file); a folder with pickled weights only is refused."""
    index = folder / INDEX_FILE
    if _exists(index):
        try:
            data = loads_strict(index.read_text(encoding="utf-8"), str(index))
        except OSError as error:
            raise _os_error(error, index, "read") from None
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            raise WeightFileError(f"{index}: not valid JSON ({error}): download or save the checkpoint again") \
                from None
        weight_map = data.get("weight_map") if isinstance(data, dict) else None
        if not isinstance(weight_map, dict) or not weight_map:
            raise WeightFileError(f"{index}: has no 'weight_map' {{tensor: file}}: the index is corrupt")
        names = sorted({str(name) for name in weight_map.values()})
        missing = [name for name in names if not _exists(folder / name)]
        if missing:
            raise WeightFileError(f"{index} names shard(s) that are not in the folder: {', '.join(missing[:4])}: "
                                  "download the missing files")
        return [folder / name for name in names]
    single = folder / "model.safetensors"
    if _exists(single):
        return [single]
    found = sorted(p for p in _listing(folder) if p.name.endswith(".safetensors") and not
                   p.name.startswith(("adapter_model", "training_")))
    if found:
        return found
    pickled = sorted(p.name for p in _listing(folder) if p.name.endswith(PICKLE_SUFFIXES))
    if pickled:
        raise WeightFileError(f"{folder}: the weights are only in pickle files ({', '.join(pickled[:3])}), which can "
                              f"run code when loaded, so vlens reads safetensors only: {CONVERT_HINT}")
    raise WeightFileError(f"{folder}: no weights (model.safetensors, or shards listed in {INDEX_FILE}): copy the "
                          "checkpoint's weight files into the folder")


def weight_tensors(folder: Path) -> dict[str, TensorInfo]:
    """Every tensor of the folder's weights, from the headers; shards and the index must agree."""
    tensors: dict[str, TensorInfo] = {}
    for path in weight_files(folder):
        for key, info in read_header(path).items():
            if key in tensors:
                raise WeightFileError(f"{folder}: tensor {key!r} is in both {tensors[key].file} and {path.name}")
            tensors[key] = info
    index = folder / INDEX_FILE
    if _exists(index):
        weight_map = loads_strict(index.read_text(encoding="utf-8"), str(index))["weight_map"]
        wrong = [key for key, file in weight_map.items() if key not in tensors or tensors[key].file != file]
        if wrong:
            raise WeightFileError(f"{index}: {len(wrong)} tensor(s) are not in the shard it names, e.g. {wrong[0]!r}: "
                                  "the index and the shards are from different checkpoints")
    return tensors


def _exists(path: Path) -> bool:
    """Whether `path` exists; an unreadable path or a symbolic-link loop is an error, not 'absent'."""
    try:
        path.stat()
    except FileNotFoundError:
        if path.is_symlink():
            raise WeightFileError(f"{path} is a symbolic link to a missing file: fix or remove the link") from None
        return False
    except OSError as error:
        raise _os_error(error, path, "read") from None
    return True


def _listing(folder: Path) -> list[Path]:
    try:
        return list(folder.iterdir())
    except OSError as error:
        raise _os_error(error, folder, "list") from None


def _os_error(error: OSError, path: Path, verb: str) -> WeightFileError:
    if error.errno in (errno.EACCES, errno.EPERM):
        return WeightFileError(f"{path}: permission denied (this user may not {verb} it): fix its permissions "
                               f"(ls -l {path}; chmod) or copy the model somewhere readable")
    if error.errno == errno.ELOOP:
        return WeightFileError(f"{path}: a symbolic link loop (the link points back to itself): fix or remove it")
    if error.errno == errno.EISDIR:
        return WeightFileError(f"{path} is a folder where a file is expected: remove or rename it")
    return WeightFileError(f"{path}: cannot {verb} it ({error.strerror or error}): check the file")


def os_error_message(error: OSError, path: str | os.PathLike, verb: str = "read") -> str:
    """The one-line message of a failed read of a model file (permission, link loop, ...)."""
    return str(_os_error(error, Path(path), verb))


__all__ = ["CONVERT_HINT", "DTYPE_BYTES", "INDEX_FILE", "ModelFolderError", "TensorInfo", "WeightFileError", "os_error_message",
           "read_header", "weight_files", "weight_tensors"]

"""Reading dataset files safely: tables of rows (with where each row came from) and image paths
that must stay inside the dataset folder.

Tables: ``.jsonl``, ``.json`` (a list of objects), ``.parquet``, ``.arrow``, a folder of
``.parquet`` files, or a Hugging Face ``save_to_disk`` folder (``dataset_info.json`` +
``state.json`` + arrow files). Every malformed line (invalid JSON, a key given twice, ``null``,
not an object, not UTF-8) raises one :class:`DatasetError` naming the file and line.

`iter_rows` streams: JSON lines are read one at a time, parquet files one row group at a time,
Arrow files one record batch at a time, so a reader that stops early (``limit``) reads only
what it needs. A ``.json`` list is read whole.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path, PurePath

from vlens.datasets.records import DatasetError, check_regular_file
from vlens.utils.errors import UserInputError
from vlens.utils.images import is_url
from vlens.utils.strict_json import loads_strict

# metadata / table files larger than this are refused (PixMo-Count's parquet with embedded
# images is ~2 GB; a metadata.jsonl is a few MB)
MAX_TABLE_BYTES = 8 * 2**30
Row = tuple[str, dict]  # (where: "<file> line N" / "<file> row N", the row)


def is_save_to_disk_folder(path: Path) -> bool:
    return path.is_dir() and (path / "state.json").is_file() and (path / "dataset_info.json").is_file()


def is_dataset_dict_folder(path: Path) -> bool:
    return path.is_dir() and (path / "dataset_dict.json").is_file()


def read_rows(path: str | os.PathLike, split: str | None = None) -> list[Row]:
    """The rows of a table file or folder, in order, each with its location (`iter_rows`, all of them).

    split: for a ``DatasetDict`` folder (``dataset_dict.json``), which split to read (required
    when it holds several).
    """
    return list(iter_rows(path, split))


def iter_rows(path: str | os.PathLike, split: str | None = None) -> Iterator[Row]:
    """The rows of a table file or folder, in order, read as they are asked for (see the module doc).
    The path is checked when this is called; rows are read as the iterator is consumed."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"data file {path} does not exist")
    if path.is_dir():
        if is_save_to_disk_folder(path) or is_dataset_dict_folder(path):
            return _read_saved(path, split)
        parquet = sorted(path.glob("*.parquet")) or sorted(path.glob("*/*.parquet"))
        if parquet:
            return (row for file in parquet for row in _read_parquet(file))
        raise DatasetError(
            f"{path} is a folder but neither an imagefolder (metadata.jsonl), a save_to_disk folder "
            "(state.json + dataset_info.json) nor a folder of .parquet files"
        )
    check_regular_file(path, MAX_TABLE_BYTES, what="data")
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        return iter_jsonl(path)
    if suffix == ".json":
        return iter(_read_json(path))
    if suffix == ".parquet":
        return _read_parquet(path)
    if suffix == ".arrow":
        return _read_arrow(path)
    raise DatasetError(
        f"cannot read {path}: use a .jsonl, .json, .parquet or .arrow file, or a save_to_disk folder"
    )


def read_jsonl(path: Path) -> list[Row]:
    """Rows of a JSON-lines file; blank lines are skipped, anything else must be an object."""
    return list(iter_jsonl(path))


def iter_jsonl(path: Path) -> Iterator[Row]:
    """`read_jsonl`, one line at a time (the file is checked when this is called)."""
    check_regular_file(path, MAX_TABLE_BYTES, what="data")
    return _jsonl_lines(path)


def _jsonl_lines(path: Path) -> Iterator[Row]:
    with path.open("rb") as handle:
        for line_number, raw in enumerate(handle, start=1):
            where = f"{path} line {line_number}"
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as error:
                raise DatasetError(f"{where} is not UTF-8 text ({error.reason} at byte {error.start}); "
                                   "save the file as UTF-8") from None
            if not line.strip():
                continue
            try:
                row = loads_strict(line, where)
            except json.JSONDecodeError as error:
                raise DatasetError(f"{where} is not valid JSON: {error}") from None
            except UserInputError as error:  # a key given twice
                raise DatasetError(str(error)) from None
            if not isinstance(row, dict):
                kind = "null" if row is None else type(row).__name__
                raise DatasetError(f"{where} must be a JSON object (one example per line), got {kind}")
            yield where, row


def _read_json(path: Path) -> list[Row]:
    try:
        data = loads_strict(path.read_bytes().decode("utf-8"), str(path))
    except UnicodeDecodeError as error:
        raise DatasetError(f"{path} is not UTF-8 text ({error.reason} at byte {error.start})") from None
    except json.JSONDecodeError as error:
        raise DatasetError(f"{path} is not valid JSON: {error}") from None
    except UserInputError as error:  # a key given twice
        raise DatasetError(str(error)) from None
    if not isinstance(data, list):
        raise DatasetError(f"{path} must hold a JSON list of objects (one per example)")
    rows = []
    for index, row in enumerate(data):
        if not isinstance(row, dict):
            kind = "null" if row is None else type(row).__name__
            raise DatasetError(f"{path} item {index} must be a JSON object, got {kind}")
        rows.append((f"{path} item {index}", row))
    return rows


def _pyarrow():
    try:
        import pyarrow
        import pyarrow.parquet  # noqa: F401
    except ImportError as error:
        raise ImportError("reading parquet / arrow files needs pyarrow: pip install 'vlens[data]'") from error
    return pyarrow


def _read_parquet(path: Path) -> Iterator[Row]:
    """Rows of a parquet file, one row group (batch) at a time."""
    pyarrow = _pyarrow()
    try:
        parquet = pyarrow.parquet.ParquetFile(path)
    except (pyarrow.ArrowException, OSError) as error:
        raise DatasetError(f"{path} is not a readable parquet file: {error}") from None
    return _batches(path, parquet.iter_batches(batch_size=256), pyarrow)


def _batches(path: Path, batches, pyarrow) -> Iterator[Row]:
    index = 0
    try:
        for batch in batches:
            for row in batch.to_pylist():
                yield f"{path} row {index}", row
                index += 1
    except (pyarrow.ArrowException, OSError) as error:
        raise DatasetError(f"{path} is not a readable table file (after row {index}): {error}") from None


def _read_arrow(path: Path) -> Iterator[Row]:
    pyarrow = _pyarrow()
    try:  # datasets writes the IPC stream format; pyarrow.feather the file format
        source = pyarrow.memory_map(str(path))
        reader = pyarrow.ipc.open_stream(source)
        return _batches(path, iter(reader), pyarrow)
    except pyarrow.ArrowInvalid:
        try:
            source = pyarrow.memory_map(str(path))
            file_reader = pyarrow.ipc.open_file(source)
        except pyarrow.ArrowInvalid as error:
            raise DatasetError(f"{path} is not an Arrow file: {error}") from None
        return _batches(path, (file_reader.get_batch(i) for i in range(file_reader.num_record_batches)), pyarrow)


def _read_saved(path: Path, split: str | None) -> Iterator[Row]:
    """A ``datasets`` save_to_disk folder (Dataset or DatasetDict); images stay undecoded."""
    try:
        import datasets
    except ImportError as error:
        raise ImportError(f"reading the save_to_disk folder {path} needs datasets: pip install 'vlens[data]'") \
            from error
    loaded = datasets.load_from_disk(str(path))
    where = str(path)
    if isinstance(loaded, datasets.DatasetDict):
        splits = sorted(loaded)
        if split is None and len(splits) != 1:
            raise DatasetError(f"{path} holds the splits {splits}: choose one (split=..., CLI --split)")
        name = split or splits[0]
        if name not in loaded:
            raise DatasetError(f"{path} has no split {name!r}; it has {splits}")
        loaded, where = loaded[name], f"{path} [{name}]"
    elif split is not None:
        raise DatasetError(f"{path} is a single dataset without splits; drop split={split!r}")
    # the raw Arrow rows: images stay {"bytes", "path"} dicts, decoded later per record with clear errors
    table = loaded.with_format("arrow")
    return _saved_rows(where, table)


def _saved_rows(where: str, table, chunk: int = 256) -> Iterator[Row]:
    for start in range(0, len(table), chunk):
        for offset, row in enumerate(table[start:start + chunk].to_pylist()):
            yield f"{where} row {start + offset}", row


def resolve_inside(base: Path, value: str, where: str, allow_absolute: bool = True) -> Path:
    """A row's relative image path -> a path inside ``base``; anything that escapes is refused.

    ``..`` parts, symbolic links out of ``base`` and (unless ``allow_absolute``) absolute paths
    raise a DatasetError naming the row. An absolute path is accepted only inside ``base``.
    """
    if not isinstance(value, str) or not value.strip() or "\x00" in value:
        raise DatasetError(f"{where}: image path must be a non-empty string, got {value!r}")
    if is_url(value):  # would otherwise be read as the relative path "http:/host/..."
        raise DatasetError(f"{where}: image {value!r} is a URL; datasets are read from local files only: download "
                           f"the images and write their paths relative to {base}")
    pure = PurePath(value)
    if pure.is_absolute() and not allow_absolute:
        raise DatasetError(f"{where}: image path {value!r} is absolute; write it relative to {base}")
    if ".." in pure.parts:
        raise DatasetError(f"{where}: image path {value!r} leaves the dataset folder ('..' is not allowed)")
    full = Path(pure) if pure.is_absolute() else base / pure
    resolved, root = full.resolve(), base.resolve()
    if not resolved.is_relative_to(root):
        how = "lies" if pure.is_absolute() else "points (through a symbolic link)"
        raise DatasetError(
            f"{where}: image path {value!r} {how} outside the dataset folder {base}; images must be inside it "
            "(or pass image_dir / --image-dir to the folder that holds them)"
        )
    return full

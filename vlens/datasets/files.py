"""Reading dataset files safely: tables of rows (with where each row came from) and image paths
that must stay inside the dataset folder.

Tables: ``.jsonl``, ``.json`` (a list of objects), ``.parquet``, ``.arrow``, a folder of
``.parquet`` files, or a Hugging Face ``save_to_disk`` folder (``dataset_info.json`` +
``state.json`` + arrow files). Every malformed line (invalid JSON, ``null``, not an object,
not UTF-8) raises one :class:`DatasetError` naming the file and line.
"""

from __future__ import annotations

import json
import os
from pathlib import Path, PurePath

from vlens.datasets.records import DatasetError, check_regular_file
from vlens.utils.images import is_url

# metadata / table files larger than this are refused (PixMo-Count's parquet with embedded
# images is ~2 GB; a metadata.jsonl is a few MB)
MAX_TABLE_BYTES = 8 * 2**30
Row = tuple[str, dict]  # (where: "<file> line N" / "<file> row N", the row)


def is_save_to_disk_folder(path: Path) -> bool:
    return path.is_dir() and (path / "state.json").is_file() and (path / "dataset_info.json").is_file()


def is_dataset_dict_folder(path: Path) -> bool:
    return path.is_dir() and (path / "dataset_dict.json").is_file()


def read_rows(path: str | os.PathLike, split: str | None = None) -> list[Row]:
    """The rows of a table file or folder, in order, each with its location.

    split: for a ``DatasetDict`` folder (``dataset_dict.json``), which split to read (required
    when it holds several).
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"data file {path} does not exist")
    if path.is_dir():
        if is_save_to_disk_folder(path) or is_dataset_dict_folder(path):
            return _read_saved(path, split)
        parquet = sorted(path.glob("*.parquet")) or sorted(path.glob("*/*.parquet"))
        if parquet:
            return [row for file in parquet for row in _read_parquet(file)]
        raise DatasetError(
            f"{path} is a folder but neither an imagefolder (metadata.jsonl), a save_to_disk folder "
            "(state.json + dataset_info.json) nor a folder of .parquet files"
        )
    check_regular_file(path, MAX_TABLE_BYTES, what="data")
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        return read_jsonl(path)
    if suffix == ".json":
        return _read_json(path)
    if suffix == ".parquet":
        return _read_parquet(path)
    if suffix == ".arrow":
        return _read_arrow(path)
    raise DatasetError(
        f"cannot read {path}: use a .jsonl, .json, .parquet or .arrow file, or a save_to_disk folder"
    )


def read_jsonl(path: Path) -> list[Row]:
    """Rows of a JSON-lines file; blank lines are skipped, anything else must be an object."""
    check_regular_file(path, MAX_TABLE_BYTES, what="data")
    rows = []
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
                row = json.loads(line)
            except json.JSONDecodeError as error:
                raise DatasetError(f"{where} is not valid JSON: {error}") from None
            if not isinstance(row, dict):
                kind = "null" if row is None else type(row).__name__
                raise DatasetError(f"{where} must be a JSON object (one example per line), got {kind}")
            rows.append((where, row))
    return rows


def _read_json(path: Path) -> list[Row]:
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError as error:
        raise DatasetError(f"{path} is not UTF-8 text ({error.reason} at byte {error.start})") from None
    except json.JSONDecodeError as error:
        raise DatasetError(f"{path} is not valid JSON: {error}") from None
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


def _read_parquet(path: Path) -> list[Row]:
    pyarrow = _pyarrow()
    try:
        table = pyarrow.parquet.read_table(path)
    except (pyarrow.ArrowException, OSError) as error:
        raise DatasetError(f"{path} is not a readable parquet file: {error}") from None
    return [(f"{path} row {index}", row) for index, row in enumerate(table.to_pylist())]


def _read_arrow(path: Path) -> list[Row]:
    pyarrow = _pyarrow()
    try:  # datasets writes the IPC stream format; pyarrow.feather the file format
        with pyarrow.memory_map(str(path)) as source:
            table = pyarrow.ipc.open_stream(source).read_all()
    except pyarrow.ArrowInvalid:
        try:
            with pyarrow.memory_map(str(path)) as source:
                table = pyarrow.ipc.open_file(source).read_all()
        except pyarrow.ArrowInvalid as error:
            raise DatasetError(f"{path} is not an Arrow file: {error}") from None
    return [(f"{path} row {index}", row) for index, row in enumerate(table.to_pylist())]


def _read_saved(path: Path, split: str | None) -> list[Row]:
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
    table = loaded.with_format("arrow")[:]
    return [(f"{where} row {index}", row) for index, row in enumerate(table.to_pylist())]


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

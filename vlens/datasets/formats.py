"""One entry point for every method: ``load_dataset(path, format=None, **options)``.

The format names the schema (imagefolder, pixmo, countbenchqa, mcq, qa); the container
(.jsonl, .json, .parquet, .arrow, a parquet folder, a ``save_to_disk`` folder) is read from the
path. Without a format, it is detected from the path and the first row's columns.
"""

from __future__ import annotations

import inspect
import itertools
from collections.abc import Callable
from pathlib import Path

from vlens.datasets.files import iter_rows
from vlens.datasets.readers import (
    METADATA_FILE,
    read_countbenchqa,
    read_imagefolder_dataset,
    read_mcq,
    read_pixmo,
    read_qa,
)
from vlens.datasets.records import DataSet, DatasetError

READERS: dict[str, Callable[..., DataSet]] = {
    "imagefolder": read_imagefolder_dataset,
    "pixmo": read_pixmo,
    "countbenchqa": read_countbenchqa,
    "mcq": read_mcq,
    "qa": read_qa,
}
DATA_FORMATS = tuple(READERS)
FORMAT_HELP = (
    "imagefolder (folder with metadata.jsonl), pixmo (PixMo-Count), countbenchqa, mcq (multiple choice, "
    "MMMU style), qa (image, question, answer); files .jsonl/.json/.parquet/.arrow or save_to_disk folders"
)


def detect_format(path: str | Path, columns: set[str] | None = None) -> str:
    """The format of a dataset, from the path and (for tables) the first row's columns."""
    path = Path(path)
    if path.is_dir() and (path / METADATA_FILE).is_file() or path.name == METADATA_FILE:
        return "imagefolder"
    if columns is None:
        first = next(iter_rows(path), None)  # only the first row is read
        if first is None:
            raise DatasetError(f"{path} holds no rows")
        columns = set(first[1])
    if "options" in columns:
        return "mcq"
    if {"number", "question"} <= columns:
        return "countbenchqa"
    if "count" in columns and ("label" in columns or "image_sha256" in columns):
        return "pixmo"
    if "question" in columns and ("answer" in columns or "count" in columns):
        return "qa"
    raise DatasetError(
        f"cannot tell the format of {path} from its columns {sorted(columns)}; pass a format "
        f"(CLI --format): {FORMAT_HELP}"
    )


def reader_options(data_format: str) -> set[str]:
    """The keyword options a format's reader accepts (besides the path)."""
    return set(inspect.signature(READERS[data_format]).parameters) - {"path", "rows", "limit"}


def load_dataset(path: str | Path, format: str | None = None, limit: int | None = None,  # noqa: A002
                 **options) -> DataSet:
    """Read any supported dataset into a :class:`DataSet`.

    Args:
        path: the data file or folder.
        format: one of ``DATA_FORMATS``; None detects it.
        limit: read only the first `limit` records: the file is read row by row (JSON lines) or
            row group by row group (parquet, Arrow) and no further than needed.
        options: reader options (image_dir, skip_missing, split, image_column, verify_sha256, ...);
            an option the format does not take is an error, never ignored.
    """
    path = Path(path)
    options = {k: v for k, v in options.items() if v is not None}
    rows = None
    if format is None:
        if not (path.is_dir() and (path / METADATA_FILE).is_file()) and path.name != METADATA_FILE:
            stream = iter_rows(path, options.get("split"))
            first = next(stream, None)
            if first is None:
                raise DatasetError(f"{path} holds no rows")
            rows = itertools.chain([first], stream)
            format = detect_format(path, set(first[1]))  # noqa: A001
        else:
            format = "imagefolder"  # noqa: A001
    if format not in READERS:
        raise DatasetError(f"unknown data format {format!r}; choose one of {', '.join(DATA_FORMATS)}")
    if format != "imagefolder" and path.is_dir() and (path / METADATA_FILE).is_file():
        raise DatasetError(f"{path} is an imagefolder ({METADATA_FILE}), not a {format} table: read it as "
                           "format imagefolder (--format imagefolder, or leave --format out)")
    accepted = reader_options(format)
    unsupported = sorted(set(options) - accepted)
    if unsupported:
        named = ", ".join(f"{name} (--{name.replace('_', '-')})" for name in unsupported)
        raise DatasetError(f"{named} do(es) not apply to the {format} format "
                           f"(it takes {', '.join(sorted(accepted)) or 'no options'})")
    if rows is not None:
        options["rows"] = rows
    return READERS[format](path, limit=limit, **options)

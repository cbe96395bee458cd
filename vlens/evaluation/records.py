"""Read a table of rows from a local .jsonl, .json (a list of objects) or .parquet file."""

from __future__ import annotations

import json
from pathlib import Path


def read_records(path: str | Path) -> list[dict]:
    """The rows of ``path`` as dicts, in file order.

    Parquet needs pyarrow (installed with ``pip install 'vlens[data]'``); parquet image
    columns exported by Hugging Face ``datasets`` come back as ``{"bytes", "path"}`` dicts.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"data file {path} does not exist")
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        return _read_jsonl(path)
    if suffix == ".json":
        rows = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
            raise ValueError(f"{path} must hold a JSON list of objects (one per example)")
        return rows
    if suffix == ".parquet":
        return _read_parquet(path)
    raise ValueError(f"cannot read {path}: use a .jsonl, .json or .parquet file")


def _read_jsonl(path: Path) -> list[dict]:
    rows = []
    with path.open(encoding="utf-8") as handle:
        for line_number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as error:
                raise ValueError(f"{path} line {line_number} is not valid JSON: {error}") from error
            if not isinstance(row, dict):
                raise ValueError(f"{path} line {line_number} must be a JSON object, got {type(row).__name__}")
            rows.append(row)
    return rows


def _read_parquet(path: Path) -> list[dict]:
    try:
        import pyarrow.parquet as pq
    except ImportError as error:
        raise ImportError(
            f"reading {path} needs pyarrow; install it with `pip install 'vlens[data]'` "
            "or convert the file to .jsonl"
        ) from error
    return pq.read_table(path).to_pylist()

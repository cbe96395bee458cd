"""Datasets on disk as a Hugging Face "imagefolder": PNG files plus ``metadata.jsonl``.

``datasets.load_dataset("imagefolder", data_dir=DIR)`` reads what this writes; vlens reads
it back with :func:`read_imagefolder`, without ``datasets``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path

from PIL import Image

METADATA_FILE = "metadata.jsonl"
# zlib level 1: several times faster than the default 6, files ~20% larger; still lossless
PNG_COMPRESS_LEVEL = 1


def image_file_name(index: int) -> str:
    """Name of the index-th image of a dataset."""
    return f"{index:06d}.png"


def save_png(image: Image.Image, path: str | os.PathLike) -> None:
    """Write a PNG whose bytes depend only on the pixels (no timestamps, no metadata)."""
    image.save(path, format="PNG", compress_level=PNG_COMPRESS_LEVEL)


def metadata_line(file_name: str, record: dict) -> str:
    """One ``metadata.jsonl`` line: ``file_name`` first, then the record."""
    if "file_name" in record:
        raise ValueError("a record must not have its own 'file_name': the writer names the files")
    return json.dumps({"file_name": file_name, **record}, separators=(",", ":"))


def prepare_out_dir(out_dir: str | os.PathLike, overwrite: bool) -> Path:
    """Create ``out_dir``; refuse to mix with an existing dataset unless ``overwrite``."""
    out = Path(out_dir)
    if (out / METADATA_FILE).exists() and not overwrite:
        raise FileExistsError(
            f"{out} already holds a dataset ({METADATA_FILE}); choose another directory or overwrite"
        )
    out.mkdir(parents=True, exist_ok=True)
    if overwrite:
        for old in out.glob("*.png"):
            old.unlink()
    return out


def write_metadata(out: Path, lines: Iterable[tuple[str, dict]]) -> None:
    """Write ``metadata.jsonl`` from (file name, record) pairs, checking they share one schema."""
    keys: set[str] | None = None
    with open(out / METADATA_FILE, "w", encoding="utf-8") as f:
        for file_name, record in lines:
            if keys is None:
                keys = set(record)
            elif set(record) != keys:
                raise ValueError(
                    f"record for {file_name} has keys {sorted(set(record) ^ keys)} that the first one "
                    "does not (or lacks them): one dataset needs one schema; write pairs, tasks and "
                    "plain images to separate directories"
                )
            f.write(metadata_line(file_name, record) + "\n")


def write_imagefolder(
    samples: Iterable[tuple[Image.Image, dict]], out_dir: str | os.PathLike, overwrite: bool = False
) -> Path:
    """Write (image, record) samples as an imagefolder; returns the directory.

    Images are ``000000.png``, ``000001.png``, ... in sample order. All records must
    have the same keys (so ``datasets`` infers one schema).
    """
    out = prepare_out_dir(out_dir, overwrite)
    rows = []
    for index, (image, record) in enumerate(samples):
        name = image_file_name(index)
        save_png(image, out / name)
        rows.append((name, record))
    write_metadata(out, rows)
    return out


class ImageRecord(dict):
    """A metadata row plus ``image_path``; :meth:`open_image` loads the pixels lazily."""

    def open_image(self) -> Image.Image:
        """The RGB image of this record."""
        with Image.open(self["image_path"]) as image:
            return image.convert("RGB")


def read_imagefolder(data_dir: str | os.PathLike) -> list[ImageRecord]:
    """Records of an imagefolder written by vlens, in file order, each with an absolute
    ``image_path``; images are opened only on :meth:`ImageRecord.open_image`."""
    root = Path(data_dir)
    meta = root / METADATA_FILE
    if not meta.is_file():
        raise FileNotFoundError(f"{meta} not found: is {root} a dataset written by `vlens data`?")
    records = []
    with open(meta, encoding="utf-8") as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{meta}:{line_no} is not valid JSON ({err})") from None
            if "file_name" not in row:
                raise ValueError(f"{meta}:{line_no} has no 'file_name'")
            records.append(ImageRecord(row, image_path=str((root / row["file_name"]).resolve())))
    return records

"""Datasets on disk as a Hugging Face "imagefolder": PNG files plus ``metadata.jsonl``.

``datasets.load_dataset("imagefolder", data_dir=DIR)`` reads what this writes; vlens reads
it back with :func:`read_imagefolder`, without ``datasets``.

Writers only write into a new or empty folder, or one vlens wrote before (it holds the marker
file ``.vlens_dataset.json``, or only vlens-named files); ``overwrite`` then removes only the
files vlens writes (numbered PNGs, ``metadata.jsonl``, the marker), never anything else.
Rows are streamed to ``metadata.jsonl.partial`` as samples are written and renamed to
``metadata.jsonl`` at the end, so a dataset is complete exactly when ``metadata.jsonl`` exists.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable
from pathlib import Path

from PIL import Image

from vlens.datasets.files import read_jsonl, resolve_inside
from vlens.datasets.records import DatasetError, open_image
from vlens.utils.errors import UserInputError

METADATA_FILE = "metadata.jsonl"
PARTIAL_METADATA = METADATA_FILE + ".partial"
MARKER_FILE = ".vlens_dataset.json"  # hidden: imagefolder readers skip it
_OWN_NAME = re.compile(r"^\d{6,}(_clean|_corrupt)?\.png$")  # what the writers name images
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
        raise UserInputError("a record must not have its own 'file_name': the writer names the files")
    return json.dumps({"file_name": file_name, **record}, separators=(",", ":"))


def is_own_file(name: str) -> bool:
    """A file name the dataset writers produce (and may remove on overwrite)."""
    return name in (METADATA_FILE, PARTIAL_METADATA, MARKER_FILE) or bool(_OWN_NAME.match(name))


def prepare_out_dir(out_dir: str | os.PathLike, overwrite: bool, info: dict | None = None) -> Path:
    """Create ``out_dir`` for a new dataset and write the marker file.

    Refuses a file, a folder holding files vlens did not write (even with ``overwrite``), and
    an existing dataset unless ``overwrite`` (which then removes only vlens's own files).
    """
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise UserInputError(f"--out {out} is a file; give a folder for the dataset")
    existing = [p for p in out.iterdir()] if out.is_dir() else []
    if existing:
        foreign = sorted(p.name for p in existing if not is_own_file(p.name) or not p.is_file())
        if foreign and not (out / MARKER_FILE).is_file():
            raise UserInputError(
                f"--out {out} is not empty and was not written by vlens data ({', '.join(foreign[:3])}"
                f"{', ...' if len(foreign) > 3 else ''}); choose a new or empty folder (nothing was written)"
            )
        if not overwrite:
            state = "a dataset" if (out / METADATA_FILE).exists() else "an unfinished dataset"
            raise FileExistsError(f"{out} already holds {state} written by vlens data; choose another folder "
                                  "or pass --overwrite to replace it")
        for old in existing:
            if is_own_file(old.name) and old.is_file():
                old.unlink()
    out.mkdir(parents=True, exist_ok=True)
    (out / MARKER_FILE).write_text(json.dumps({"vlens_dataset": 1, **(info or {})}) + "\n", encoding="utf-8")
    return out


class MetadataWriter:
    """Streams ``metadata.jsonl`` rows to disk, checking that they share one schema; `close()`
    publishes the file (renamed from ``metadata.jsonl.partial``)."""

    def __init__(self, out: Path):
        self.out = Path(out)
        self.keys: set[str] | None = None
        self.n_rows = 0
        self.file = open(self.out / PARTIAL_METADATA, "w", encoding="utf-8")  # noqa: SIM115 - closed in close()

    def write(self, file_name: str, record: dict) -> None:
        if self.keys is None:
            self.keys = set(record)
        elif set(record) != self.keys:
            raise UserInputError(
                f"record for {file_name} has keys {sorted(set(record) ^ self.keys)} that the first one "
                "does not (or lacks them): one dataset needs one schema; write pairs, tasks and "
                "plain images to separate directories"
            )
        self.file.write(metadata_line(file_name, record) + "\n")
        self.n_rows += 1

    def close(self) -> None:
        self.file.close()
        os.replace(self.out / PARTIAL_METADATA, self.out / METADATA_FILE)

    def abort(self) -> None:
        self.file.close()


def write_imagefolder(
    samples: Iterable[tuple[Image.Image, dict]], out_dir: str | os.PathLike, overwrite: bool = False
) -> Path:
    """Write (image, record) samples as an imagefolder; returns the directory.

    Images are ``000000.png``, ``000001.png``, ... in sample order. All records must
    have the same keys (so ``datasets`` infers one schema).
    """
    out = prepare_out_dir(out_dir, overwrite)
    writer = MetadataWriter(out)
    try:
        for index, (image, record) in enumerate(samples):
            name = image_file_name(index)
            save_png(image, out / name)
            writer.write(name, record)
    except BaseException:
        writer.abort()
        raise
    writer.close()
    return out


class ImageRecord(dict):
    """A metadata row plus ``image_path``; :meth:`open_image` loads the pixels lazily."""

    def open_image(self) -> Image.Image:
        """The RGB image of this record (an UnreadableImageError names a file that cannot be decoded)."""
        return open_image(Path(self["image_path"]))


def record_image(record: dict) -> Image.Image:
    """The image of a record: its in-memory ``image``, else the file at ``image_path`` (as RGB)."""
    if record.get("image") is not None:
        return record["image"]
    if "image_path" not in record:
        raise UserInputError(f"the record has neither 'image' nor 'image_path' (keys: {sorted(record)})")
    return open_image(Path(record["image_path"]))  # checked, EXIF-upright, 8-bit RGB


def read_imagefolder(data_dir: str | os.PathLike) -> list[ImageRecord]:
    """Records of an imagefolder written by vlens, in file order, each with an absolute
    ``image_path``; images are opened only on :meth:`ImageRecord.open_image`.

    ``file_name`` must be a relative path inside the folder; a malformed line (invalid JSON,
    null, not UTF-8, no file_name) raises one DatasetError naming the file and line.
    """
    root = Path(data_dir)
    meta = root / METADATA_FILE
    if not meta.is_file():
        raise FileNotFoundError(f"{meta} not found: is {root} a dataset written by `vlens data`?")
    records = []
    for where, row in read_jsonl(meta):
        if not isinstance(row.get("file_name"), str):
            raise DatasetError(f"{where} has no 'file_name' (the image's path inside {root})")
        path = resolve_inside(root, row["file_name"], where, allow_absolute=False)
        records.append(ImageRecord(row, image_path=str(path.resolve())))
    return records

"""Command-line options for reading a dataset, shared by every command that reads one.

Only the standard library at import time (command modules stay light); the dataset layer
(:mod:`vlens.datasets`) is imported when data is loaded.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from vlens.utils.validation import arg_path

# the names of vlens.datasets.DATA_FORMATS (a test keeps them equal)
DATA_FORMATS = ("imagefolder", "pixmo", "countbenchqa", "mcq", "qa")
FORMAT_HELP = (
    "dataset format (default: detected from the path and columns): imagefolder (folder with metadata.jsonl), "
    "pixmo (PixMo-Count), countbenchqa, mcq (multiple choice, MMMU style), qa (image, question, answer); "
    "read from .jsonl/.json/.parquet/.arrow files, parquet folders or datasets save_to_disk folders"
)


def add_data_arguments(parser: argparse.ArgumentParser, flag: str = "--data", multiple: bool = False,
                       required: bool = False, help: str | None = None, group=None) -> None:  # noqa: A002
    """``flag`` (one path, or several with ``multiple``), ``--format``, ``--split``, ``--image-dir``,
    ``--skip-missing``. ``group``: a mutually exclusive group to put ``flag`` in."""
    target = group if group is not None else parser
    target.add_argument(flag, nargs="+" if multiple else None, type=arg_path, required=required,
                        metavar="PATH", help=help or "dataset file or folder (see --format)")
    parser.add_argument("--format", dest="data_format", choices=DATA_FORMATS, default=None, help=FORMAT_HELP)
    parser.add_argument("--split", default=None, help="split of a save_to_disk DatasetDict folder (e.g. test)")
    parser.add_argument("--image-dir", type=arg_path, default=None,
                        help="folder relative image paths are in (default: the data file's folder)")
    parser.add_argument("--skip-missing", action="store_true",
                        help="skip rows whose image file is missing (listed in the output) instead of stopping")


def load_data_arg(args: argparse.Namespace, path: Path, limit: int | None = None):
    """The :class:`vlens.datasets.DataSet` at ``path`` read with the command's data options; with
    `limit`, only the first `limit` records are read (the file no further than needed)."""
    from vlens.datasets import load_dataset

    return load_dataset(path, getattr(args, "data_format", None), limit=limit,
                        image_dir=getattr(args, "image_dir", None),
                        split=getattr(args, "split", None), skip_missing=getattr(args, "skip_missing", False) or None)

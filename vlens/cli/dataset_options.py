"""Command-line options for reading a dataset, shared by every command that reads one.

Only the standard library at import time (command modules stay light); the dataset layer
(:mod:`vlens.datasets`) is imported when data is loaded.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from vlens.cli.early_checks import missing_message
from vlens.utils.errors import UserInputError
from vlens.utils.validation import arg_path, check_output_apart

# the names of vlens.datasets.DATA_FORMATS (a test keeps them equal)
DATA_FORMATS = ("imagefolder", "pixmo", "countbenchqa", "mcq", "qa")
FORMAT_HELP = (
    "dataset format (default: detected from the path and columns): imagefolder (folder with metadata.jsonl), "
    "pixmo (PixMo-Count), countbenchqa, mcq (multiple choice, MMMU style), qa (image, question, answer); "
    "read from .jsonl/.json/.parquet/.arrow files, parquet folders or datasets save_to_disk folders"
)


# the names of vlens.datasets.boxes.BOX_FORMATS (a test keeps them equal)
BOX_FORMATS = ("xyxy", "xywh", "cxcywh", "xyxy_norm", "xywh_norm", "cxcywh_norm")


def add_data_arguments(parser: argparse.ArgumentParser, flag: str = "--data", multiple: bool = False,
                       required: bool = False, help: str | None = None, group=None) -> None:  # noqa: A002
    """``flag`` (one path, or several with ``multiple``), ``--format``, ``--split``, ``--image-dir``,
    ``--skip-missing``. ``group``: a mutually exclusive group to put ``flag`` in."""
    target = group if group is not None else parser
    action = target.add_argument(flag, nargs="+" if multiple else None, type=arg_path, required=required,
                                 metavar="PATH", help=help or "dataset file or folder (see --format)")
    parser.add_argument("--format", dest="data_format", choices=DATA_FORMATS, default=None, help=FORMAT_HELP)
    parser.add_argument("--split", default=None, help="split of a save_to_disk DatasetDict folder (e.g. test)")
    image_dir = parser.add_argument("--image-dir", type=arg_path, default=None,
                                    help="folder relative image paths are in (default: the data file's folder)")
    mark_input_paths(parser, action.dest, image_dir.dest)
    parser.add_argument("--skip-missing", action="store_true",
                        help="skip rows whose image file is missing (listed in the output) instead of stopping")
    parser.add_argument("--box-format", default=None, choices=BOX_FORMATS,
                        help="what the rows' object boxes are (imagefolder and qa; default xyxy pixels, what "
                             "`vlens data` writes): xyxy, xywh (COCO), cxcywh, or those with _norm (fractions of "
                             "the image's width and height)")


def mark_input_paths(parser: argparse.ArgumentParser, *dests: str) -> None:
    """Record that the arguments `dests` name files or folders that must exist: `check_input_paths`
    (run before the command starts, so before torch is imported) refuses a missing one in one line."""
    known = tuple(parser.get_default("input_paths") or ())
    parser.set_defaults(input_paths=known + tuple(d for d in dests if d not in known))


def check_input_paths(args: argparse.Namespace) -> None:
    """Every input path the command's arguments name (`mark_input_paths`) exists, else one
    `UserInputError` naming the flag and the path: a misspelt --data fails in the time the
    interpreter takes to start, not after the model has loaded."""
    for dest in getattr(args, "input_paths", ()) or ():
        value = getattr(args, dest, None)
        for path in value if isinstance(value, (list, tuple)) else [value]:
            if path is not None and not Path(path).expanduser().exists():
                raise UserInputError(missing_message("--" + dest.replace("_", "-"), str(path)))


# inputs a command reads without marking them (a model folder given as --model, a stage's --init-from)
UNMARKED_INPUTS = ("model", "init_from")


def check_out_apart(args: argparse.Namespace) -> None:
    """--out is neither one of the command's inputs (a local --model folder, --data, --temps, ... ) nor
    inside one nor around one (`vlens.utils.validation.check_output_apart`)."""
    out = getattr(args, "out", None)
    if not isinstance(out, (str, os.PathLike)):
        return
    dests = tuple(getattr(args, "input_paths", ()) or ()) + UNMARKED_INPUTS
    inputs = []
    for dest in dict.fromkeys(dests):
        value = getattr(args, dest, None)
        for path in value if isinstance(value, (list, tuple)) else [value]:
            inputs.append(("--" + dest.replace("_", "-"), path))
    check_output_apart(out, inputs)


def load_data_arg(args: argparse.Namespace, path: Path, limit: int | None = None):
    """The :class:`vlens.datasets.DataSet` at ``path`` read with the command's data options; with
    `limit`, only the first `limit` records are read (the file no further than needed)."""
    from vlens.datasets import load_dataset

    return load_dataset(path, getattr(args, "data_format", None), limit=limit,
                        image_dir=getattr(args, "image_dir", None),
                        split=getattr(args, "split", None), skip_missing=getattr(args, "skip_missing", False) or None,
                        box_format=getattr(args, "box_format", None))

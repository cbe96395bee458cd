"""Readers for each dataset format, all returning a :class:`DataSet` of :class:`Record`.

| format         | rows                                                                      |
|----------------|---------------------------------------------------------------------------|
| ``imagefolder``| folder with images + ``metadata.jsonl``: file_name, question, answer      |
|                | and/or count, optional objects/targets/centres, task, pair_id, role, ...  |
| ``pixmo``      | PixMo-Count: image_url, image_sha256, count, label (question optional),   |
|                | points (x, y pixels: the object centres, train split only), and a local   |
|                | image path/bytes column, or images named ``<sha256>.<ext>``               |
| ``countbenchqa``| CountBenchQA: image, question, number (text: the caption, kept in extra) |
| ``mcq``        | multiple choice (MMMU, RealWorldQA style): question, options (list, dict, |
|                | or a string holding a list), answer (letter, 0-based index or option      |
|                | text), images in image / images / image_1, image_2, ...                   |
| ``qa``         | generic: image (or images), question, answer; optional count, objects     |

Rows come from ``.jsonl``, ``.json``, ``.parquet``, ``.arrow``, a folder of parquet files or a
``save_to_disk`` folder (see :mod:`vlens.datasets.files`). Image values are a path inside the
image folder (default: the data file's folder) or a ``{"bytes", "path"}`` dict. A row whose image
is missing raises :class:`MissingImageError` naming the file; with ``skip_missing=True`` it is
listed in ``DataSet.skipped`` instead.
"""

from __future__ import annotations

import ast
import hashlib
import json
import re
from collections.abc import Callable, Iterable
from pathlib import Path

from vlens.datasets.boxes import check_box_format, row_boxes
from vlens.datasets.fields import (
    answer_target,
    as_int,
    as_text,
    extra_fields,
    pixmo_points,
    require,
    resolve_image,
    row_count,
    row_image_size,
    row_objects,
)
from vlens.datasets.files import Row, iter_jsonl, iter_rows
from vlens.datasets.records import (
    DataSet,
    DatasetError,
    ImageSource,
    MissingImageError,
    Record,
    SkippedRecord,
)
from vlens.utils.errors import UserInputError

PIXMO_QUESTION_TEMPLATE = "How many {label} are there?"
PIXMO_IMAGE_COLUMNS = ("image_path", "image", "file_name", "path")
METADATA_FILE = "metadata.jsonl"
_NUMBERED_IMAGE = re.compile(r"^image_(\d+)$")
Builder = Callable[[dict, str, str], Record]


class SkipRow(Exception):
    """A row that is valid data but not for this reader (e.g. an open question in an MCQ set)."""


def collect(format_name: str, source: str, rows: Iterable[Row], build: Builder, skip_missing: bool,
            limit: int | None = None) -> DataSet:
    """Build a record per row; a missing image raises or (skip_missing) is recorded. With `limit`,
    rows are read only until that many records are built (the rest of the file is never read)."""
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise DatasetError(f"limit must be an integer >= 1 (or None for all), got {limit!r}")
    examples: list[Record] = []
    skipped: list[SkippedRecord] = []
    for index, (where, row) in enumerate(rows):
        if limit is not None and len(examples) >= limit:
            break
        example_id = str(row.get("id", index))
        try:
            record = build(row, example_id, where)
        except SkipRow as reason:
            skipped.append(SkippedRecord(id=example_id, reason=f"{where}: {reason}"))
            continue
        except MissingImageError as error:
            if not skip_missing:
                raise MissingImageError(
                    f"{error}. Fix the path (or image_dir), or pass skip_missing=True "
                    "(CLI: --skip-missing) to skip such rows and count them in the report."
                ) from None
            skipped.append(SkippedRecord(id=example_id, reason=str(error)))
            continue
        record.source = where
        examples.append(record)
    ids = [e.id for e in examples]
    if len(set(ids)) != len(ids):
        duplicates = sorted({i for i in ids if ids.count(i) > 1})[:5]
        raise DatasetError(f"{source}: example ids must be unique; repeated: {duplicates}")
    return DataSet(format=format_name, source=str(source), examples=examples, skipped=skipped)


def _base(path: Path, image_dir) -> Path:
    if image_dir is not None:
        return Path(image_dir)
    return path if path.is_dir() else path.parent


# ---------------------------------------------------------------------- imagefolder
def read_imagefolder_dataset(path, skip_missing: bool = False, limit: int | None = None,
                             box_format: str = "xyxy") -> DataSet:
    """A folder with ``metadata.jsonl`` (or that file): vlens data sets and HF imagefolders.

    ``file_name`` must name a regular file inside the folder. The answer is the row's
    ``answer`` (``count`` when absent); the target is that answer as an int when it is a whole
    number, else its text. Object boxes and masks (`Record.boxes`) are read in ``box_format``
    (`vlens.datasets.boxes`; default ``xyxy`` pixels, what vlens data writes).
    """
    check_box_format(box_format)
    path = Path(path)
    folder = path.parent if path.is_file() else path
    metadata = folder / METADATA_FILE
    if not metadata.is_file():
        raise FileNotFoundError(f"{metadata} not found: is {folder} an imagefolder (e.g. written by `vlens data`)?")

    def build(row: dict, _: str, where: str) -> Record:
        require(row, ("file_name", "question"), where, "imagefolder")
        if row.get("answer") is None and row.get("count") is None:
            raise DatasetError(f"{where} has neither 'answer' nor 'count'; imagefolder rows need one of them")
        answer = as_text(row["answer"] if row.get("answer") is not None else row["count"], "answer", where)
        return Record(
            id=as_text(row["file_name"], "file_name", where),
            images=[resolve_image(row["file_name"], folder, where, allow_absolute=False)],
            question=as_text(row["question"], "question", where),
            target=answer_target(answer),
            answer=answer.strip(),
            count=row_count(row, answer, where),
            objects=row_objects(row, 1, where),
            boxes=row_boxes(row, 1, where, box_format, row_image_size(row, where)),
            extra=extra_fields(row, {"file_name", "question"}),
        )

    return collect("imagefolder", str(metadata), iter_jsonl(metadata), build, skip_missing, limit)


# ---------------------------------------------------------------------- PixMo-Count
def _index_images_by_stem(image_dir: Path) -> dict[str, Path]:
    if not image_dir.is_dir():
        raise FileNotFoundError(f"image folder {image_dir} does not exist")
    return {p.stem.lower(): p for p in image_dir.iterdir() if p.is_file()}


def read_pixmo(
    path,
    image_dir=None,
    image_column: str | None = None,
    question_template: str = PIXMO_QUESTION_TEMPLATE,
    verify_sha256: bool = False,
    skip_missing: bool = False,
    split: str | None = None,
    rows: Iterable[Row] | None = None,
    limit: int | None = None,
) -> DataSet:
    """A local copy of PixMo-Count.

    Each row's image is its ``image_column`` (default: the first of image_path, image,
    file_name, path present), else the file named ``<image_sha256>.<ext>`` in ``image_dir``.
    The question is the row's ``question`` if present (without ``<image>`` markers), else
    ``question_template`` filled with the row's ``label``. ``verify_sha256`` checks each file
    against ``image_sha256`` (a changed download is reported like a missing file).
    """
    path = Path(path)
    base_dir = _base(path, image_dir)
    by_sha: dict[str, Path] | None = None

    def find_image(row: dict, where: str) -> ImageSource:
        nonlocal by_sha
        column = image_column or next((c for c in PIXMO_IMAGE_COLUMNS if row.get(c)), None)
        if image_column is not None and not row.get(image_column):
            raise DatasetError(f"{where} has no value in the image column {image_column!r}")
        if column is not None:
            return resolve_image(row[column], base_dir, where)
        if not row.get("image_sha256"):
            raise DatasetError(
                f"{where} has no image path column ({', '.join(PIXMO_IMAGE_COLUMNS)}) and no image_sha256; "
                "add a path column (or pass image_column) or images named by sha256 in image_dir"
            )
        if by_sha is None:
            by_sha = _index_images_by_stem(base_dir)
        sha = str(row["image_sha256"]).lower()
        if sha not in by_sha:
            raise MissingImageError(f"{where}: no image named {sha}.<ext> in {base_dir}")
        return by_sha[sha]

    def build(row: dict, example_id: str, where: str) -> Record:
        require(row, ("count", "label"), where, "pixmo")
        image = find_image(row, where)
        if verify_sha256 and row.get("image_sha256"):
            if not isinstance(image, (bytes, Path)):
                raise DatasetError(f"{where}: image_sha256 can only check an image file or its bytes")
            data = image if isinstance(image, bytes) else image.read_bytes()
            if hashlib.sha256(data).hexdigest() != str(row["image_sha256"]).lower():
                raise MissingImageError(f"{where}: image sha256 differs from image_sha256 (the download changed)")
        # lmms-eval's copy has "<image>" markers in its questions; the chat template places images
        question = as_text(row.get("question") or "", "question", where).replace("<image>", "").strip()
        question = question or question_template.format(label=as_text(row["label"], "label", where))
        count = as_int(row["count"], "count", where)
        return Record(
            id=example_id,
            images=[image],
            question=question,
            target=count,
            count=count,
            objects=pixmo_points(row.get("points"), where),
            extra=extra_fields(row, {"count", "question", image_column or ""} | set(PIXMO_IMAGE_COLUMNS)),
        )

    return collect("pixmo", str(path), rows if rows is not None else iter_rows(path, split), build, skip_missing,
                   limit)


# ---------------------------------------------------------------------- CountBenchQA
def read_countbenchqa(
    path, image_dir=None, skip_missing: bool = False, split: str | None = None, rows: Iterable[Row] | None = None,
    limit: int | None = None,
) -> DataSet:
    """A local copy of CountBenchQA (rows with image, question, number; ``text`` kept in extra)."""
    path = Path(path)
    base_dir = _base(path, image_dir)

    def build(row: dict, example_id: str, where: str) -> Record:
        require(row, ("image", "question", "number"), where, "countbenchqa")
        count = as_int(row["number"], "number", where)
        return Record(
            id=example_id,
            images=[resolve_image(row["image"], base_dir, where)],
            question=as_text(row["question"], "question", where),
            target=count,
            count=count,
            extra=extra_fields(row, {"question", "number"}),
        )

    rows = rows if rows is not None else iter_rows(path, split)
    return collect("countbenchqa", str(path), rows, build, skip_missing, limit)


# ---------------------------------------------------------------------- multiple choice
def option_letters(n: int) -> list[str]:
    """["A", "B", ...] for n options (at most 26)."""
    if not 1 <= n <= 26:
        raise UserInputError(f"multiple choice needs 1 to 26 options, got {n}")
    return [chr(ord("A") + i) for i in range(n)]


def parse_options(value, where: str) -> list[str]:
    """Options as a list, a {"A": text} dict, or a string holding a list (as MMMU stores them)."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            try:
                value = ast.literal_eval(value)
            except (ValueError, SyntaxError, MemoryError, RecursionError):
                raise DatasetError(f"{where}: options string {value!r:.80} is not a list") from None
    if isinstance(value, dict):
        keys = sorted(value)
        if len(keys) > 26 or keys != option_letters(len(keys)):
            raise DatasetError(f"{where}: option keys must be A, B, C, ... in order, got {keys}")
        value = [value[k] for k in keys]
    if not isinstance(value, list) or len(value) < 2:
        raise DatasetError(f"{where}: options must list at least two choices, got {value!r:.80}")
    if len(value) > 26:
        raise DatasetError(f"{where}: at most 26 options (A-Z), got {len(value)}")
    return [as_text(option, "option", where) for option in value]


def answer_letter(answer, options: list[str], where: str) -> str:
    """The answer as a letter: given as a letter, a 0-based index, or an option's text."""
    letters = option_letters(len(options))
    if isinstance(answer, bool):
        raise DatasetError(f"{where}: answer {answer!r} is not a letter, index or option text")
    if isinstance(answer, int):
        if 0 <= answer < len(options):
            return letters[answer]
        raise DatasetError(f"{where}: answer index {answer} is outside the {len(options)} options")
    text = as_text(answer, "answer", where).strip()
    stripped = text.strip("()").rstrip(".")
    if stripped in letters:
        return stripped
    matches = [letter for letter, option in zip(letters, options, strict=True) if option.strip() == text]
    if len(matches) == 1:
        return matches[0]
    raise DatasetError(
        f"{where}: answer {answer!r:.80} is neither a letter {letters[0]}-{letters[-1]}, "
        f"a 0-based index, nor exactly one option's text ({options})"
    )


def image_values(row: dict, where: str) -> list:
    """A row's image values in prompt order: ``images`` (a list), ``image``, or ``image_1``, ...
    (MMMU: empty numbered columns are None and left out)."""
    if row.get("images") is not None:
        values = row["images"]
        return list(values) if isinstance(values, list | tuple) else [values]
    if row.get("image") is not None:
        return [row["image"]]
    numbered = sorted(
        (int(m.group(1)), key) for key in row if (m := _NUMBERED_IMAGE.match(key)) and row[key] is not None
    )
    if numbered:
        return [row[key] for _, key in numbered]
    raise DatasetError(f"{where} lacks 'image' (a path), 'images' (a list of paths) or image_1, image_2, ...")


def read_mcq(
    path, image_dir=None, skip_missing: bool = False, split: str | None = None, rows: Iterable[Row] | None = None,
    limit: int | None = None,
) -> DataSet:
    """A multiple-choice file (MMMU style). Open questions (MMMU's ``question_type`` "open", or
    no options) are skipped and listed in ``DataSet.skipped``."""
    path = Path(path)
    base_dir = _base(path, image_dir)

    def build(row: dict, example_id: str, where: str) -> Record:
        require(row, ("question", "options", "answer"), where, "mcq")
        if row.get("question_type") == "open" or row["options"] in ("[]", []):
            raise SkipRow("an open question (no options) is not multiple choice")
        options = parse_options(row["options"], where)
        letter = answer_letter(row["answer"], options, where)
        return Record(
            id=example_id,
            images=[resolve_image(v, base_dir, where) for v in image_values(row, where)],
            question=as_text(row["question"], "question", where),
            target=letter,
            options=options,
            extra=extra_fields(row, {"question", "options"} | {k for k in row if _NUMBERED_IMAGE.match(k)}),
        )

    return collect("mcq", str(path), rows if rows is not None else iter_rows(path, split), build, skip_missing,
                   limit)


# ---------------------------------------------------------------------- generic question / answer
def read_qa(
    path, image_dir=None, skip_missing: bool = False, split: str | None = None, rows: Iterable[Row] | None = None,
    limit: int | None = None, box_format: str = "xyxy",
) -> DataSet:
    """Generic rows with image(s), question and answer (any text); optional count, object
    centres and object boxes / masks in ``box_format`` (e.g. a vlens data set saved with ``datasets``'
    save_to_disk; COCO-style ``objects`` with ``box_format="xywh"``)."""
    check_box_format(box_format)
    path = Path(path)
    base_dir = _base(path, image_dir)

    def build(row: dict, example_id: str, where: str) -> Record:
        require(row, ("question",), where, "qa")
        if row.get("answer") is None and row.get("count") is None:
            raise DatasetError(f"{where} has neither 'answer' nor 'count'; qa rows need one of them")
        answer = as_text(row["answer"] if row.get("answer") is not None else row["count"], "answer", where)
        images = [resolve_image(v, base_dir, where) for v in image_values(row, where)]
        return Record(
            id=str(row.get("file_name") or example_id),
            images=images,
            question=as_text(row["question"], "question", where),
            target=answer_target(answer),
            answer=answer.strip(),
            count=row_count(row, answer, where),
            objects=row_objects(row, len(images), where),
            boxes=row_boxes(row, len(images), where, box_format, row_image_size(row, where)),
            extra=extra_fields(row, {"question", "file_name"} | {k for k in row if _NUMBERED_IMAGE.match(k)}),
        )

    return collect("qa", str(path), rows if rows is not None else iter_rows(path, split), build, skip_missing,
                   limit)

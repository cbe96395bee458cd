"""Readers for local copies of the evaluation sets, each returning an :class:`EvalDataset`.

| format         | file                                   | fields per row                                   |
|----------------|----------------------------------------|--------------------------------------------------|
| ``imagefolder``| folder with PNGs + ``metadata.jsonl``  | file_name, count, question, answer (the target: |
|                | (vlens synthetic counting sets)        | an integer; ``count`` if absent), task, seed, ...|
| ``pixmo``      | PixMo-Count .parquet/.jsonl/.json      | image_url, image_sha256, count, points, label,   |
|                |                                        | and a local image path column, or images named   |
|                |                                        | ``<sha256>.<ext>`` in ``image_dir``              |
| ``countbenchqa``| CountBenchQA .parquet/.jsonl/.json    | image, question, number                          |
| ``mcq``        | generic multiple choice (MMMU,         | image (or images: a list), question, options,    |
|                | RealWorldQA, MathVista style)          | answer (letter, 0-based index or option text)    |

Image values may be a path (absolute, or relative to ``image_dir``, which defaults to the
data file's folder) or a Hugging Face ``{"bytes": ..., "path": ...}`` dict. A row whose
image cannot be found raises :class:`MissingImageError` naming the file; with
``skip_missing=True`` the row is skipped and listed in ``EvalDataset.skipped`` instead.
Bulky fields (``points``, ``objects``, embedded image bytes) are not copied into ``extra``.
"""

from __future__ import annotations

import ast
import hashlib
import json
from collections.abc import Callable
from pathlib import Path

from vlens.data.imagefolder import read_imagefolder
from vlens.evaluation.examples import (
    EvalDataset,
    EvalExample,
    ImageSource,
    MissingImageError,
    SkippedExample,
)
from vlens.evaluation.parsing import option_letters
from vlens.evaluation.records import read_records

PIXMO_QUESTION_TEMPLATE = "How many {label} are there?"
PIXMO_IMAGE_COLUMNS = ("image_path", "image", "file_name", "path")
_BULKY_FIELDS = {"points", "objects", "image", "images"}


def _require(row: dict, fields: tuple[str, ...], where: str, format_name: str) -> None:
    missing = [f for f in fields if f not in row or row[f] is None]
    if missing:
        raise ValueError(
            f"{where} lacks {missing}; {format_name} rows need the fields {list(fields)} "
            f"(it has {sorted(row)})"
        )


def _as_int(value, field_name: str, where: str) -> int:
    try:
        as_float = float(value)
    except (TypeError, ValueError):
        as_float = float("nan")
    if as_float != as_float or as_float != int(as_float):
        raise ValueError(f"{where}: {field_name} must be a whole number, got {value!r}")
    return int(as_float)


def _extra(row: dict, used: set[str]) -> dict:
    return {k: v for k, v in row.items() if k not in used and k not in _BULKY_FIELDS}


def resolve_image(value, base_dir: Path, where: str) -> ImageSource:
    """A row's image value (path string or ``{"bytes", "path"}`` dict) -> an ImageSource."""
    if isinstance(value, dict):
        if value.get("bytes"):
            return bytes(value["bytes"])
        value = value.get("path")
    if not isinstance(value, str) or not value:
        raise ValueError(f"{where}: image must be a file path or a {{'bytes', 'path'}} dict, got {value!r}")
    path = Path(value).expanduser()
    if not path.is_absolute():
        path = base_dir / path
    if not path.is_file():
        raise MissingImageError(f"{where}: image file {path} does not exist")
    return path


def _collect(
    format_name: str,
    source: Path,
    rows: list[dict],
    build: Callable[[dict, str, str], EvalExample],
    skip_missing: bool,
) -> EvalDataset:
    """Build an example per row; a missing image raises or (skip_missing) is recorded."""
    examples, skipped = [], []
    for index, row in enumerate(rows):
        example_id = str(row.get("id", index))
        where = f"{source} row {index} (id {example_id})"
        try:
            examples.append(build(row, example_id, where))
        except MissingImageError as error:
            if not skip_missing:
                raise MissingImageError(
                    f"{error}. Fix the path (or image_dir), or pass skip_missing=True "
                    "(CLI: --skip-missing) to skip such rows and count them in the report."
                ) from None
            skipped.append(SkippedExample(id=example_id, reason=str(error)))
    ids = [e.id for e in examples]
    if len(set(ids)) != len(ids):
        duplicates = sorted({i for i in ids if ids.count(i) > 1})[:5]
        raise ValueError(f"{source}: example ids must be unique; repeated: {duplicates}")
    return EvalDataset(format=format_name, source=str(source), examples=examples, skipped=skipped)


def _imagefolder_target(row: dict, where: str) -> int:
    """The count a counting question asks for: its ``answer`` (which for "how many squares"
    differs from ``count``, the number of all objects), or ``count`` when there is no answer."""
    if row.get("answer") is None:
        return _as_int(row["count"], "count", where)
    answer = str(row["answer"]).strip()
    if not answer.isdigit():
        raise ValueError(
            f"{where}: answer {answer!r} (task {row.get('task')!r}) is not a count; vlens eval scores "
            "counting imagefolders, so write each counting task suite to its own folder"
        )
    return int(answer)


def read_counting_imagefolder(path: str | Path, skip_missing: bool = False) -> EvalDataset:
    """A vlens counting imagefolder (a folder with ``metadata.jsonl``, or that file itself) as an
    `EvalDataset` (the records themselves: `vlens.data.read_imagefolder`).

    The target is the row's ``answer`` as an integer (``count`` when there is no answer).
    """
    path = Path(path)
    folder = path.parent if path.is_file() else path
    metadata = folder / "metadata.jsonl"

    def build(row: dict, _: str, where: str) -> EvalExample:
        _require(row, ("file_name", "count", "question"), where, "imagefolder")
        return EvalExample(
            id=str(row["file_name"]),
            images=[resolve_image(row["image_path"], folder, where)],
            question=str(row["question"]),
            target=_imagefolder_target(row, where),
            extra=_extra(row, {"file_name", "image_path", "question"}),
        )

    rows = [dict(record) for record in read_imagefolder(folder)]
    return _collect("imagefolder", metadata, rows, build, skip_missing)


def _index_images_by_stem(image_dir: Path) -> dict[str, Path]:
    if not image_dir.is_dir():
        raise FileNotFoundError(f"image folder {image_dir} does not exist")
    return {p.stem.lower(): p for p in image_dir.iterdir() if p.is_file()}


def read_pixmo(
    path: str | Path,
    image_dir: str | Path | None = None,
    image_column: str | None = None,
    question_template: str = PIXMO_QUESTION_TEMPLATE,
    verify_sha256: bool = False,
    skip_missing: bool = False,
) -> EvalDataset:
    """A local copy of PixMo-Count.

    Each row's image is its ``image_column`` (default: the first of image_path, image,
    file_name, path present), else the file named ``<image_sha256>.<ext>`` in ``image_dir``.
    The question is the row's ``question`` if present (without ``<image>`` markers), else
    ``question_template`` filled with the row's ``label``. ``verify_sha256`` checks each file against ``image_sha256``
    (a changed download is reported like a missing file).
    """
    path = Path(path)
    base_dir = Path(image_dir) if image_dir is not None else path.parent
    by_sha: dict[str, Path] | None = None

    def find_image(row: dict, where: str) -> ImageSource:
        nonlocal by_sha
        column = image_column or next((c for c in PIXMO_IMAGE_COLUMNS if row.get(c)), None)
        if image_column is not None and not row.get(image_column):
            raise ValueError(f"{where} has no value in the image column {image_column!r}")
        if column is not None:
            return resolve_image(row[column], base_dir, where)
        if not row.get("image_sha256"):
            raise ValueError(
                f"{where} has no image path column ({', '.join(PIXMO_IMAGE_COLUMNS)}) and no image_sha256; "
                "add a path column (or pass image_column) or images named by sha256 in image_dir"
            )
        if by_sha is None:
            by_sha = _index_images_by_stem(base_dir)
        sha = str(row["image_sha256"]).lower()
        if sha not in by_sha:
            raise MissingImageError(f"{where}: no image named {sha}.<ext> in {base_dir}")
        return by_sha[sha]

    def build(row: dict, example_id: str, where: str) -> EvalExample:
        _require(row, ("count", "label"), where, "pixmo")
        image = find_image(row, where)
        if verify_sha256 and row.get("image_sha256"):
            data = image if isinstance(image, bytes) else image.read_bytes()
            if hashlib.sha256(data).hexdigest() != str(row["image_sha256"]).lower():
                raise MissingImageError(
                    f"{where}: image sha256 differs from image_sha256 (the download changed)"
                )
        # lmms-eval's copy has "<image>" markers in its questions; the chat template places images
        question = str(row.get("question") or "").replace("<image>", "").strip()
        question = question or question_template.format(label=row["label"])
        return EvalExample(
            id=example_id,
            images=[image],
            question=str(question),
            target=_as_int(row["count"], "count", where),
            extra=_extra(row, {"count", "question", image_column or ""} | set(PIXMO_IMAGE_COLUMNS)),
        )

    return _collect("pixmo", path, read_records(path), build, skip_missing)


def read_countbenchqa(
    path: str | Path, image_dir: str | Path | None = None, skip_missing: bool = False
) -> EvalDataset:
    """A local copy of CountBenchQA (rows with image, question, number)."""
    path = Path(path)
    base_dir = Path(image_dir) if image_dir is not None else path.parent

    def build(row: dict, example_id: str, where: str) -> EvalExample:
        _require(row, ("image", "question", "number"), where, "countbenchqa")
        return EvalExample(
            id=example_id,
            images=[resolve_image(row["image"], base_dir, where)],
            question=str(row["question"]),
            target=_as_int(row["number"], "number", where),
            extra=_extra(row, {"question", "number"}),
        )

    return _collect("countbenchqa", path, read_records(path), build, skip_missing)


def _parse_options(value, where: str) -> list[str]:
    """Options as a list, a {"A": text} dict, or a string holding a list (as MMMU stores them)."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            try:
                value = ast.literal_eval(value)
            except (ValueError, SyntaxError) as error:
                raise ValueError(f"{where}: options string {value!r} is not a list") from error
    if isinstance(value, dict):
        keys = sorted(value)
        if keys != option_letters(len(keys)):
            raise ValueError(f"{where}: option keys must be A, B, C, ... in order, got {keys}")
        value = [value[k] for k in keys]
    if not isinstance(value, list) or len(value) < 2:
        raise ValueError(f"{where}: options must list at least two choices, got {value!r}")
    return [str(option) for option in value]


def _answer_letter(answer, options: list[str], where: str) -> str:
    """The answer as a letter: given as a letter, a 0-based index, or an option's text."""
    letters = option_letters(len(options))
    if isinstance(answer, bool):
        raise ValueError(f"{where}: answer {answer!r} is not a letter, index or option text")
    if isinstance(answer, int):
        if 0 <= answer < len(options):
            return letters[answer]
        raise ValueError(f"{where}: answer index {answer} is outside the {len(options)} options")
    text = str(answer).strip()
    stripped = text.strip("()").rstrip(".")
    if stripped in letters:
        return stripped
    matches = [letter for letter, option in zip(letters, options, strict=True) if option.strip() == text]
    if len(matches) == 1:
        return matches[0]
    raise ValueError(
        f"{where}: answer {answer!r} is neither a letter {letters[0]}-{letters[-1]}, "
        f"a 0-based index, nor exactly one option's text ({options})"
    )


def read_mcq(
    path: str | Path, image_dir: str | Path | None = None, skip_missing: bool = False
) -> EvalDataset:
    """A generic multiple-choice file (rows with image or images, question, options, answer)."""
    path = Path(path)
    base_dir = Path(image_dir) if image_dir is not None else path.parent

    def build(row: dict, example_id: str, where: str) -> EvalExample:
        _require(row, ("question", "options", "answer"), where, "mcq")
        image_values = row.get("images") if row.get("images") is not None else row.get("image")
        if image_values is None:
            raise ValueError(f"{where} lacks 'image' (a path) or 'images' (a list of paths)")
        if not isinstance(image_values, list):
            image_values = [image_values]
        options = _parse_options(row["options"], where)
        return EvalExample(
            id=example_id,
            images=[resolve_image(v, base_dir, where) for v in image_values],
            question=str(row["question"]),
            target=_answer_letter(row["answer"], options, where),
            options=options,
            extra=_extra(row, {"question", "options"}),
        )

    return _collect("mcq", path, read_records(path), build, skip_missing)

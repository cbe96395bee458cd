"""The record every dataset reader produces, and how its images are found and opened.

One :class:`Record` is one question about zero or more images, with what the methods need:
the answer text (what a model should say), the scored target (a count, an option letter or
the answer text), the object count, the options of a multiple-choice question, object centres
(per image, in original pixels) when the data has them, an id and where it came from.
"""

from __future__ import annotations

import io
import stat
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from PIL import Image

from vlens.utils.errors import UserInputError
from vlens.utils.images import (
    MAX_IMAGE_BYTES,  # one limit for every image vlens opens
    to_rgb,
    upright,
    with_source,
)

# A file on disk, the encoded bytes of an image stored inside the data file (Hugging Face
# parquet / arrow exports keep images as {"bytes": ..., "path": ...}), or an image in memory.
ImageSource = Path | bytes | Image.Image
# per image: object centres [(x, y), ...] in original pixels and that image's (width, height),
# None where the data does not give it (read from the opened image)
ImageObjects = tuple[list[tuple[float, float]], tuple[int, int] | None]



class DatasetError(UserInputError):
    """A dataset file or row is malformed; the message names the file (and line or row)."""


class MissingImageError(FileNotFoundError):
    """An example names an image file that does not exist (or fails its checksum)."""


class UnreadableImageError(DatasetError):
    """An image file exists but cannot be decoded (or is not a regular file, or is too large)."""


@dataclass
class Record:
    """One question about zero or more images.

    Attributes:
        id: unique within its dataset (file name, row id, or row number).
        images: where each image is, in prompt order.
        question: the question text as stored, without any answer-format instruction.
        answer: the answer text a model should produce ("3", "red", "B").
        target: what scoring compares: the count (int) for counting questions, the option
            letter for multiple choice, else the answer text.
        count: the number of objects the question asks about, when known.
        options: the option texts of a multiple-choice question, else None.
        objects: per image, (centres [(x, y)] in original pixels, (width, height)) when the
            data has object positions, else None.
        boxes: per image, its objects' boxes (`vlens.datasets.boxes.ObjectBox`: box, label, mask) when the
            data has them (read in the reader's ``box_format``), else None.
        source: "<file> line N" / "<file> row N": where the record was read.
        extra: the row's other fields (task, pair_id, role, category, ...), for breakdowns.
    """

    id: str
    images: list[ImageSource]
    question: str
    target: int | str
    options: list[str] | None = None
    extra: dict = field(default_factory=dict)
    answer: str = ""
    count: int | None = None
    objects: list[ImageObjects] | None = None
    source: str = ""
    boxes: list[list] | None = None

    def __post_init__(self):
        if not self.answer:
            self.answer = str(self.target)

    def prompt_text(self) -> str:
        """The question, then ``"A. option"`` lines for a multiple-choice question."""
        if self.options is None:
            return self.question
        letters = [chr(ord("A") + i) for i in range(len(self.options))]
        return "\n".join([self.question] + [f"{k}. {o}" for k, o in zip(letters, self.options, strict=True)])

    def as_dict(self, images: list[Image.Image]) -> dict:
        """A plain row for methods that read dict samples: the row's extra fields, then ``question``
        (with options), ``answer``, ``count``, ``id``, ``source`` and ``image`` (one opened image,
        or the list when there are several)."""
        image = images[0] if len(images) == 1 else list(images)
        return {**self.extra, "question": self.prompt_text(), "answer": self.answer, "count": self.count,
                "id": self.id, "source": self.source, "image": image}


@dataclass
class SkippedRecord:
    """A row left out, and why (reported, never silently dropped)."""

    id: str
    reason: str


@dataclass
class DataSet:
    """Records read from one local file or folder, plus the rows that were skipped."""

    format: str
    source: str
    examples: list[Record]
    skipped: list[SkippedRecord] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.examples)

    @property
    def records(self) -> list[Record]:
        return self.examples

    def head(self, limit: int | None) -> DataSet:
        """The first ``limit`` records (all for None), keeping the skipped list."""
        if limit is not None and limit < 1:
            raise UserInputError(f"limit must be >= 1 (or None for all), got {limit}")
        examples = self.examples if limit is None else self.examples[:limit]
        return DataSet(self.format, self.source, examples, list(self.skipped))


def check_regular_file(path: Path, max_bytes: int | None = MAX_IMAGE_BYTES, what: str = "image") -> None:
    """Refuse anything but a regular file within the size limit, before opening it.

    A FIFO or device would block or stream forever on open/read; a huge file would exhaust
    memory. Raises MissingImageError when absent, UnreadableImageError otherwise.
    """
    try:
        info = path.stat()
    except FileNotFoundError:
        raise MissingImageError(f"{what} file {path} does not exist") from None
    except OSError as error:
        raise UnreadableImageError(f"{what} file {path} cannot be read: {error}") from None
    if not stat.S_ISREG(info.st_mode):
        raise UnreadableImageError(f"{what} file {path} is not a regular file (a FIFO, device or folder)")
    if max_bytes is not None and info.st_size > max_bytes:
        raise UnreadableImageError(
            f"{what} file {path} is {info.st_size / 2**20:.1f} MiB, over the {max_bytes / 2**20:.0f} MiB limit"
        )


def open_image(source: ImageSource, max_bytes: int | None = MAX_IMAGE_BYTES) -> Image.Image:
    """Load one image as RGB (the processors expect three channels).

    Raises:
        MissingImageError: the file does not exist.
        UnreadableImageError: naming the file, when it is not a regular file, is too large or
            cannot be decoded (truncated, not an image, a decompression bomb).
    """
    where = describe_image(source)
    if isinstance(source, Image.Image):  # already decoded (e.g. a generated image)
        return to_rgb(source, what=f"image {where}")
    if isinstance(source, bytes):
        if max_bytes is not None and len(source) > max_bytes:
            raise UnreadableImageError(f"embedded image of {len(source)} bytes is over the size limit")
        opener: io.BytesIO | Path = io.BytesIO(source)
    else:
        check_regular_file(Path(source), max_bytes)
        opener = Path(source)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(opener) as image:
                image.load()
                # EXIF orientation applied (a phone photo is stored sideways); 16-bit, float, alpha as prepare() does
                return with_source(to_rgb(upright(image), what=f"image {where}"), where)
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombWarning, Image.DecompressionBombError) as error:
        raise UnreadableImageError(f"image {where} cannot be decoded: {error}") from None


def open_images(sources: Sequence[ImageSource]) -> list[Image.Image]:
    """Load an example's images in order."""
    return [open_image(source) for source in sources]


def describe_image(source: ImageSource) -> str:
    """A short printable name: the path, ``<N embedded bytes>`` or ``<W x H image in memory>``."""
    if isinstance(source, Image.Image):
        return f"<{source.width} x {source.height} image in memory>"
    return str(source) if isinstance(source, Path) else f"<{len(source)} embedded bytes>"


def load_record_images(
    dataset: DataSet, skip_unreadable: bool = True, refusal: Callable[[Image.Image], str | None] | None = None
) -> list[tuple[Record, list[Image.Image]]]:
    """(record, opened images) for every record whose images decode.

    A record with a missing or undecodable image is moved to ``dataset.skipped`` (the reason
    names the file) when ``skip_unreadable``, else the error is raised. ``refusal(image)``, when
    given, says why the model's processor would refuse an image (e.g.
    ``lambda im: vlens.core.processing.image_refusal(model.processor, im)``); such a record is
    skipped the same way. Raises a DatasetError when no record is left.
    """
    loaded = []
    for record in dataset.examples:
        try:
            images = open_images(record.images)
            for source, image in zip(record.images, images, strict=True):
                reason = refusal(image) if refusal is not None else None
                if reason is not None:
                    raise UnreadableImageError(f"image {describe_image(source)} ({image.width} x {image.height} px): "
                                               f"the model's image processor refuses it ({reason})")
            loaded.append((record, images))
        except (MissingImageError, UnreadableImageError) as error:
            if not skip_unreadable:
                raise
            dataset.skipped.append(SkippedRecord(record.id, str(error)))
    if dataset.skipped:
        names = "; ".join(s.reason for s in dataset.skipped[:3])
        warnings.warn(f"{dataset.source}: skipped {len(dataset.skipped)} record(s): {names}", stacklevel=2)
    if not loaded:
        raise DatasetError(f"{dataset.source}: no record has readable images ({len(dataset.skipped)} skipped)")
    return loaded


def record_dicts(dataset: DataSet, limit: int | None = None,
                 refusal: Callable[[Image.Image], str | None] | None = None) -> list[dict]:
    """``Record.as_dict`` of the first ``limit`` records with readable images (others are skipped
    by file name, see :func:`load_record_images`, as are those `refusal` refuses)."""
    return [record.as_dict(images) for record, images in load_record_images(dataset.head(limit), refusal=refusal)]

"""The common record every reader produces, and how its images are found and opened."""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from PIL import Image

# A file on disk, or the encoded bytes of an image stored inside the data file
# (Hugging Face parquet exports keep images as {"bytes": ..., "path": ...}).
ImageSource = Path | bytes


class MissingImageError(FileNotFoundError):
    """An example names an image file that does not exist (or fails its checksum)."""


@dataclass
class EvalExample:
    """One question about one or more images.

    Attributes:
        id: unique within its dataset (file name, sha256, row number, or the row's own id).
        images: where each image is, in prompt order.
        question: the question text as stored, without any answer-format instruction.
        target: the true count (counting sets) or option letter "A".."Z" (multiple choice).
        options: the option texts of a multiple-choice question, else None.
        extra: the row's other fields (task, pair_id, category, ...), kept for breakdowns.
    """

    id: str
    images: list[ImageSource]
    question: str
    target: int | str
    options: list[str] | None = None
    extra: dict = field(default_factory=dict)


@dataclass
class SkippedExample:
    """A row left out of evaluation, and why (reported, never silently dropped)."""

    id: str
    reason: str


@dataclass
class EvalDataset:
    """Examples read from one local file or folder, plus the rows that were skipped."""

    format: str
    source: str
    examples: list[EvalExample]
    skipped: list[SkippedExample] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.examples)


def open_image(source: ImageSource) -> Image.Image:
    """Load one image as RGB (the processors expect three channels)."""
    if isinstance(source, bytes):
        return Image.open(io.BytesIO(source)).convert("RGB")
    with Image.open(source) as image:
        return image.convert("RGB")


def open_images(sources: Sequence[ImageSource]) -> list[Image.Image]:
    """Load an example's images in order."""
    return [open_image(source) for source in sources]

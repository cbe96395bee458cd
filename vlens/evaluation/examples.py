"""The evaluation names of the shared dataset layer's record types (:mod:`vlens.datasets`)."""

from __future__ import annotations

from vlens.datasets.records import (
    DataSet as EvalDataset,
)
from vlens.datasets.records import (
    MissingImageError,
    UnreadableImageError,
    open_image,
    open_images,
)
from vlens.datasets.records import (
    Record as EvalExample,
)
from vlens.datasets.records import (
    SkippedRecord as SkippedExample,
)

__all__ = [
    "EvalDataset",
    "EvalExample",
    "MissingImageError",
    "SkippedExample",
    "UnreadableImageError",
    "open_image",
    "open_images",
]

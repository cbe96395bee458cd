"""Evaluation readers: the shared dataset layer (:mod:`vlens.datasets`), with the counting
check that ``vlens eval`` needs for imagefolders.

See :mod:`vlens.datasets.readers` for every format's fields and :func:`vlens.datasets.load_dataset`
for reading any of them (with format detection).
"""

from __future__ import annotations

from vlens.datasets.readers import (
    PIXMO_IMAGE_COLUMNS,
    PIXMO_QUESTION_TEMPLATE,
    read_countbenchqa,
    read_imagefolder_dataset,
    read_mcq,
    read_pixmo,
    read_qa,
)
from vlens.datasets.records import DataSet, DatasetError

__all__ = [
    "PIXMO_IMAGE_COLUMNS",
    "PIXMO_QUESTION_TEMPLATE",
    "check_counting",
    "read_countbenchqa",
    "read_counting_imagefolder",
    "read_mcq",
    "read_pixmo",
    "read_qa",
]


def check_counting(dataset: DataSet) -> DataSet:
    """Refuse a set whose targets are not counts (e.g. a colour task suite) for counting scores."""
    for record in dataset.examples:
        if not isinstance(record.target, int):
            raise DatasetError(
                f"{record.source}: answer {record.answer!r} (task {record.extra.get('task')!r}) is not a count; "
                "vlens eval scores counting imagefolders, so write each counting task suite to its own folder"
            )
    return dataset


def read_counting_imagefolder(path, skip_missing: bool = False) -> DataSet:
    """A counting imagefolder (``metadata.jsonl``) as a DataSet: targets are the answers as integers
    (the records themselves: `vlens.data.read_imagefolder`)."""
    return check_counting(read_imagefolder_dataset(path, skip_missing=skip_missing))

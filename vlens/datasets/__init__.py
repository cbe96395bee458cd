"""The dataset layer every method reads: local copies of real sets and vlens's own data.

```python
from vlens.datasets import load_dataset
data = load_dataset("pixmo_count_test.parquet", image_dir="images/", skip_missing=True)  # detected: pixmo
data = load_dataset("mmmu_val/", format="mcq")                     # a save_to_disk folder
for record in data.examples: record.question, record.answer, record.target, record.images
```

Formats: ``imagefolder``, ``pixmo``, ``countbenchqa``, ``mcq``, ``qa`` (see
:mod:`vlens.datasets.readers`); containers .jsonl, .json, .parquet, .arrow, parquet folders and
``save_to_disk`` folders (:mod:`vlens.datasets.files`). Image paths must stay inside the dataset
folder; malformed rows raise one :class:`DatasetError` naming the file and line.
"""

from vlens.datasets.formats import DATA_FORMATS, FORMAT_HELP, READERS, detect_format, load_dataset
from vlens.datasets.readers import (
    PIXMO_QUESTION_TEMPLATE,
    answer_letter,
    option_letters,
    parse_options,
    read_countbenchqa,
    read_imagefolder_dataset,
    read_mcq,
    read_pixmo,
    read_qa,
)
from vlens.datasets.records import (
    MAX_IMAGE_BYTES,
    DataSet,
    DatasetError,
    ImageObjects,
    ImageSource,
    MissingImageError,
    Record,
    SkippedRecord,
    UnreadableImageError,
    load_record_images,
    open_image,
    open_images,
    record_dicts,
)

__all__ = [
    "DATA_FORMATS",
    "FORMAT_HELP",
    "MAX_IMAGE_BYTES",
    "PIXMO_QUESTION_TEMPLATE",
    "READERS",
    "DataSet",
    "DatasetError",
    "ImageObjects",
    "ImageSource",
    "MissingImageError",
    "Record",
    "SkippedRecord",
    "UnreadableImageError",
    "answer_letter",
    "detect_format",
    "load_dataset",
    "load_record_images",
    "open_image",
    "open_images",
    "option_letters",
    "parse_options",
    "read_countbenchqa",
    "read_imagefolder_dataset",
    "read_mcq",
    "read_pixmo",
    "read_qa",
    "record_dicts",
]

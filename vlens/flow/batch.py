"""Examples for the flow methods: an image, a question, its answer and the box of the object it is about.

    batch = object_task_batch("name", n=32, size=64)         # generated (vlens.data.objects / task suites)
    batch = FlowBatch.from_records(records)                    # rows of a vlens imagefolder
    inputs, answers, objects = batch.encode(model, range(8))   # VLMInputs, answer ids [8], object positions

The answer is scored by its first token at the final prompt position (every answer of the synthetic
tasks is one word). The object's tokens are the image tokens whose cells the object's box overlaps, on
every view of the image (`inputs.regions.from_box`, see docs/regions.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from vlens.core.answer_tokens import answer_ids
from vlens.core.image_regions import TokenSelection
from vlens.core.inputs import VLMInputs
from vlens.data import make_task_sample, record_image
from vlens.data.objects import OBJECT_TASKS, make_object_sample
from vlens.utils.errors import UserInputError
from vlens.zoo.image_sizes import render_size

if TYPE_CHECKING:
    from vlens.core.model import HookedVLM

# the task suites' tasks whose question is about one object (its id in the record's "targets")
SUITE_OBJECT_TASKS = ("colour", "shape")
TASK_NAMES = (*OBJECT_TASKS, *SUITE_OBJECT_TASKS)


@dataclass
class FlowExample:
    """One example: image, question, answer, and the box (x0, y0, x1, y1) in original pixels of the
    object the question is about (None when the example names none)."""

    image: Any
    question: str
    answer: str
    box: tuple[float, float, float, float] | None = None


def object_selection(inputs: VLMInputs, row: int, box: Sequence[float]) -> TokenSelection:
    """The tokens of the row's (first) image that the pixel box (x0, y0, x1, y1) of the original image
    overlaps, on every view of the image (`inputs.regions.from_box`: the family's own geometry)."""
    regions = inputs.token_regions
    if not regions.images[row]:
        raise UserInputError(f"row {row} has no image, so its object box selects nothing")
    image_index = sum(len(regions.images[r]) for r in range(row))  # images are counted row by row
    return regions.from_box(image_index, tuple(float(v) for v in box))


@dataclass
class FlowBatch:
    """Examples to run knockout and ablation on (see the module docstring)."""

    name: str
    examples: list[FlowExample]

    def __post_init__(self) -> None:
        if not self.examples:
            raise UserInputError(f"flow batch {self.name!r} has no examples")

    def __len__(self) -> int:
        return len(self.examples)

    @property
    def has_objects(self) -> bool:
        return all(example.box is not None for example in self.examples)

    @classmethod
    def from_records(cls, records: Sequence[dict], name: str = "data") -> FlowBatch:
        """Rows of a vlens imagefolder (or any dicts with an image / image_path, "question", "answer"; the
        object box from "objects"[id]["bbox"] of the first of "targets" when given)."""
        examples = []
        for i, record in enumerate(records):
            missing = [key for key in ("question", "answer") if not record.get(key)]
            if missing:
                raise UserInputError(f"record {i} has no {' / '.join(missing)}: every example needs a question and "
                                     "its answer")
            box = None
            targets, objects = record.get("targets") or [], record.get("objects") or []
            if len(targets) == 1:  # one asked object: its box
                found = [o for o in objects if o.get("id") == targets[0] and o.get("bbox") is not None]
                box = tuple(float(v) for v in found[0]["bbox"]) if found else None
            examples.append(FlowExample(record_image(record), str(record["question"]), str(record["answer"]),
                                        box))  # type: ignore[arg-type]
        return cls(name, examples)

    def encode(self, model: HookedVLM, rows: Sequence[int]) -> tuple[VLMInputs, Tensor, list[TokenSelection] | None]:
        """(inputs, answer ids [n] (each answer's first token), per row the object's `TokenSelection`
        (`.positions`: LongTensor [k]) or None when some example has no box) for the examples `rows`."""
        chosen = [self.examples[int(i)] for i in rows]
        inputs = model.prepare(images=[e.image for e in chosen], prompts=[e.question for e in chosen])
        answers = torch.tensor([answer_ids(model, e.answer, example=e.question)[0] for e in chosen], dtype=torch.long)
        if not all(e.box is not None for e in chosen):
            return inputs, answers, None
        objects = []
        for row, example in enumerate(chosen):
            assert example.box is not None
            selection = object_selection(inputs, row, example.box)
            if not len(selection.positions):
                raise UserInputError(f"example {int(rows[row])}: the object's box {example.box} covers no image token "
                                     "(the preprocessing crops it away)")
            objects.append(selection)
        return inputs, answers, objects


def object_task_batch(task: str, n: int, seed: int = 0, size: int | None = None, style: str = "synpoly") -> FlowBatch:
    """n generated examples of an object task: "name", "colour_at" (`vlens.data.objects`) or the task
    suites' one-object questions "colour" ("What colour is the {shape}?"), "shape"; seeds seed .. seed + n - 1.
    size: image side in px; None: the embedded model's own size (`vlens.zoo.image_sizes.render_size`; pass
    ``render_size(model, fallback=OBJECT_IMAGE_SIZE)`` for another model's, 64 px under dynamic resolution)."""
    size = render_size(image_size=size)
    if task not in TASK_NAMES:
        raise UserInputError(f"unknown object task {task!r}; choose one of {', '.join(TASK_NAMES)}")
    if n < 1:
        raise UserInputError(f"an object task batch needs n >= 1 examples, got {n}")
    records = []
    for i in range(n):
        if task in OBJECT_TASKS:
            image, record = make_object_sample(task, seed + i, size=size, style=style)
        else:
            image, record = make_task_sample(task, seed + i, size=size, style=style)
        records.append({**record, "image": image})
    return FlowBatch.from_records(records, name=task)

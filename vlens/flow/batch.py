"""Examples for the flow methods: an image, a question, its answer and the box of the object it is about.

    batch = object_task_batch("name", n=32, size=64)         # generated (vlens.data.objects / task suites)
    batch = FlowBatch.from_records(records)                    # rows of a vlens imagefolder
    inputs, answers, objects = batch.encode(model, range(8))   # VLMInputs, answer ids [8], object positions

The answer is scored by its first token at the final prompt position (every answer of the synthetic
tasks is one word). The object's tokens are the image tokens whose cells the object's box overlaps
(`box_positions`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from jaxtyping import Int
from torch import Tensor

from vlens.core.answer_tokens import answer_ids
from vlens.core.inputs import VLMInputs
from vlens.data import make_task_sample, record_image
from vlens.data.objects import OBJECT_TASKS, make_object_sample
from vlens.utils.errors import UserInputError

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


def box_positions(model: HookedVLM, inputs: VLMInputs, row: int, box: Sequence[float],
                  image_size: tuple[int, int], image: int = 0) -> Int[Tensor, " n"]:
    """Positions of the image tokens whose cells the pixel box overlaps, on the view covering the whole image.

    box: (x0, y0, x1, y1) in the original image's pixels; image_size: its (width, height). The box's
    corners go through the family's own pixel -> grid mapping (`adapter.image_points_to_tile`, what
    L_focus uses); a cell (r, c) spans [r - 0.5, r + 0.5] x [c - 0.5, c + 0.5] in grid coordinates.
    Returns a sorted LongTensor (empty when the preprocessing crops the box away).
    """
    x0, y0, x1, y1 = (float(v) for v in box)
    if not (x1 > x0 and y1 > y0):
        raise UserInputError(f"object box {tuple(box)} is empty: give (x0, y0, x1, y1) with x1 > x0 and y1 > y0")
    view = inputs.token_regions.image_view(row, image)
    corners = torch.tensor([[x0, y0], [x1, y1]], dtype=torch.float64)
    grid_points, _ = model.adapter.image_points_to_tile(model.processor, corners, image_size, view)
    rows, cols = view.grid
    (r0, c0), (r1, c1) = grid_points.tolist()
    r_lo, r_hi = max(int(torch.floor(torch.tensor(r0 - 0.5))) + 1, 0), min(int(torch.ceil(torch.tensor(r1 + 0.5))) - 1, rows - 1)
    c_lo, c_hi = max(int(torch.floor(torch.tensor(c0 - 0.5))) + 1, 0), min(int(torch.ceil(torch.tensor(c1 + 0.5))) - 1, cols - 1)
    if r_lo > r_hi or c_lo > c_hi:
        return torch.zeros(0, dtype=torch.long)
    cells = [r * cols + c for r in range(r_lo, r_hi + 1) for c in range(c_lo, c_hi + 1)]
    return view.positions[torch.tensor(cells, dtype=torch.long)].cpu().sort().values


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

    def encode(self, model: HookedVLM, rows: Sequence[int]) -> tuple[VLMInputs, Tensor, list[Tensor] | None]:
        """(inputs, answer ids [n] (each answer's first token), per row the object's token positions or
        None when some example has no box) for the examples `rows`."""
        chosen = [self.examples[int(i)] for i in rows]
        inputs = model.prepare(images=[e.image for e in chosen], prompts=[e.question for e in chosen])
        answers = torch.tensor([answer_ids(model, e.answer, example=e.question)[0] for e in chosen], dtype=torch.long)
        if not all(e.box is not None for e in chosen):
            return inputs, answers, None
        objects = []
        for row, example in enumerate(chosen):
            assert example.box is not None
            positions = box_positions(model, inputs, row, example.box, example.image.size)
            if not len(positions):
                raise UserInputError(f"example {int(rows[row])}: the object's box {example.box} covers no image token "
                                     "(the preprocessing crops it away)")
            objects.append(positions)
        return inputs, answers, objects


def object_task_batch(task: str, n: int, seed: int = 0, size: int = 64, style: str = "synpoly") -> FlowBatch:
    """n generated examples of an object task: "name", "colour_at" (`vlens.data.objects`) or the task
    suites' one-object questions "colour" ("What colour is the {shape}?"), "shape"; seeds seed .. seed + n - 1."""
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

"""Evaluation sets for head ablation: prompts, images and answers (their tokens) per task.

Answers follow vlens's answer rule (`vlens.core.answers`): each is tokenised as it continues the
chat prompt, its tokens but the last are teacher-forced after the prompt (`TaskBatch.inputs`),
and the ablation metrics score the whole answer's log-probability.

A task name is a task of the suites (`vlens.data.TASKS`), optionally with a style after "@":
"counting" (SynPoly), "counting@synreal" (counting on SynReal-lite), "counting@syndot".
Evaluation and reference examples of a task come from disjoint seed ranges, so the mean an
ablation writes in never saw the examples it is evaluated on.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from jaxtyping import Int
from torch import Tensor

from vlens.core.answers import answer_ids, teacher_force
from vlens.core.inputs import VLMInputs
from vlens.core.processing import image_refusal
from vlens.data import TASKS, make_task_sample
from vlens.datasets import DatasetError, load_record_images
from vlens.utils.errors import UserInputError

if TYPE_CHECKING:
    from vlens.core.model import HookedVLM


DEFAULT_STYLE = "synpoly"
# Reference seeds start here (evaluation seeds are seed, seed + 1, ...): disjoint by construction,
# and away from the embedded model's training (1e6 + i) and held-out (9e8 + i) seed ranges.
REFERENCE_SEED_OFFSET = 500_000_000
TASK_ALIASES = {"counting_synreal": "counting@synreal", "synreal": "counting@synreal", "color": "colour"}


@dataclass
class TaskBatch:
    """Examples of one task with their answers' tokens.

    Attributes:
        name: the task name as given ("counting", "counting@synreal", or any label).
        prompts: one question per example (chat-formatted by `model.prepare`).
        images: per example an image, a list of images, or None (text-only).
        answers: the answer strings; `answer_tokens` per example the answer's token ids
            (a [n] tensor of single tokens is accepted too).
        records: the generator's metadata per example (may be empty dicts).
        chat: whether prompts go through the chat template.
    """

    name: str
    prompts: list[str]
    images: list[Any]
    answers: list[str]
    answer_tokens: list[list[int]]
    records: list[dict] = field(default_factory=list)
    chat: bool = True

    def __post_init__(self):
        n = len(self.prompts)
        if isinstance(self.answer_tokens, Tensor):
            self.answer_tokens = [[int(t)] for t in self.answer_tokens.reshape(-1).tolist()]
        self.answer_tokens = [[int(t) for t in a] for a in self.answer_tokens]
        if not (len(self.images) == len(self.answers) == len(self.answer_tokens) == n):
            raise UserInputError(
                f"TaskBatch {self.name!r}: {n} prompts, {len(self.images)} images, {len(self.answers)} answers "
                f"and {len(self.answer_tokens)} answer token lists; give one of each per example."
            )
        if any(not a for a in self.answer_tokens):
            raise UserInputError(f"TaskBatch {self.name!r}: an answer has no tokens")
        if n == 0:
            raise UserInputError(f"TaskBatch {self.name!r} has no examples.")

    def __len__(self) -> int:
        return len(self.prompts)

    @property
    def answer_ids(self) -> Int[Tensor, "n"]:
        """[n] each answer's token, for single-token answers; a clear error naming a longer one."""
        for answer, ids in zip(self.answers, self.answer_tokens, strict=True):
            if len(ids) != 1:
                raise UserInputError(f"TaskBatch {self.name!r}: answer_ids needs single-token answers, but {answer!r} is "
                                 f"{len(ids)} tokens {ids}; use answer_tokens")
        return torch.tensor([a[0] for a in self.answer_tokens], dtype=torch.long)

    def inputs(self, model: HookedVLM, rows: Sequence[int] | range) -> VLMInputs:
        """`VLMInputs` (left-padded) for the given example rows, each answer teacher-forced but its
        last token (the last len(answer) positions predict the answer; single tokens add nothing)."""
        rows = list(rows)
        inputs = model.prepare(images=[self.images[r] for r in rows], prompts=[self.prompts[r] for r in rows],
                               chat=self.chat)
        return teacher_force(model, inputs, [self.answer_tokens[r] for r in rows])

    @staticmethod
    def concat(name: str, batches: Sequence[TaskBatch]) -> TaskBatch:
        """All examples of several batches (e.g. a reference set pooled over tasks)."""
        return TaskBatch(
            name=name,
            prompts=[p for b in batches for p in b.prompts],
            images=[i for b in batches for i in b.images],
            answers=[a for b in batches for a in b.answers],
            answer_tokens=[a for b in batches for a in b.answer_tokens],
            records=[r for b in batches for r in b.records],
            chat=batches[0].chat,
        )


def answer_token_ids(model: HookedVLM, answers: Sequence[str], chat: bool = True) -> list[list[int]]:
    """Each answer's token ids as the model would generate them (`vlens.core.answers.answer_ids`).

    Raises:
        ValueError: naming the example, if an answer is outside the vocabulary (the unknown token).
    """
    return [answer_ids(model, answer, example=f"#{i}", chat=chat) for i, answer in enumerate(answers)]


def parse_task(name: str) -> tuple[str, str]:
    """'counting@synreal' -> ('counting', 'synreal'); 'colour' -> ('colour', 'synpoly')."""
    name = TASK_ALIASES.get(name.strip(), name.strip())
    task, _, style = name.partition("@")
    style = style or DEFAULT_STYLE
    if task not in TASKS:
        raise UserInputError(f"unknown task {name!r}: use one of {', '.join(TASKS)}, optionally as TASK@STYLE "
                         "(e.g. counting@synreal)")
    return task, style


def canonical_task_name(name: str) -> str:
    task, style = parse_task(name)
    return task if style == DEFAULT_STYLE else f"{task}@{style}"


def build_task_batch(model: HookedVLM, name: str, n: int, seed: int = 0, image_size: int = 224,
                     reference: bool = False) -> TaskBatch:
    """`n` examples of a task-suite task, deterministic in (name, n, seed, image_size).

    reference: draw from the reference seed range (seed + REFERENCE_SEED_OFFSET + i) instead
    of the evaluation range (seed + i); the two never overlap for n < REFERENCE_SEED_OFFSET.
    """
    if n < 1:
        raise UserInputError(f"need at least one example per task, got n={n}")
    task, style = parse_task(name)
    start = seed + (REFERENCE_SEED_OFFSET if reference else 0)
    images, prompts, answers, records = [], [], [], []
    for i in range(n):
        image, record = make_task_sample(task, seed=start + i, size=image_size, style=style)
        images.append(image)
        prompts.append(record["question"])
        answers.append(str(record["answer"]))
        records.append(record)
    label = canonical_task_name(name) + (" (reference)" if reference else "")
    return TaskBatch(label, prompts, images, answers, answer_token_ids(model, answers), records)


def dataset_task_batches(model: HookedVLM, dataset, n_examples: int, n_reference: int,
                         name: str | None = None) -> tuple[TaskBatch, TaskBatch]:
    """A real dataset (:func:`vlens.datasets.load_dataset`) as one task: (evaluation, reference).

    The first ``n_examples`` readable records are evaluated, the next ``n_reference`` give the
    reference means (disjoint rows). A set with fewer records is split in half instead, and
    the batch names say so. Prompts are the questions (with options for multiple choice),
    answers the records' answer texts; unreadable images, and those the model's processor refuses,
    are skipped by file name.
    """
    if n_examples < 1 or n_reference < 1:
        raise UserInputError(f"n_examples and n_reference must be >= 1, got {n_examples} and {n_reference}")
    name = name or Path(dataset.source).stem
    loaded = load_record_images(dataset.head(n_examples + n_reference),  # refused images skipped by name too
                                refusal=lambda image: image_refusal(model.processor, image))
    if len(loaded) < 2:
        raise DatasetError(f"{dataset.source}: a task needs at least 2 readable records (evaluation and "
                           f"reference), it has {len(loaded)}")
    split = n_examples if len(loaded) == n_examples + n_reference else (len(loaded) + 1) // 2
    if split != n_examples:
        warnings.warn(f"{dataset.source}: {len(loaded)} readable records, fewer than {n_examples} + {n_reference}: "
                      f"{split} evaluated, {len(loaded) - split} for the reference means", stacklevel=2)

    def batch(rows, label):
        prompts = [record.prompt_text() for record, _ in rows]
        answers = [record.answer for record, _ in rows]
        images = [images[0] if len(images) == 1 else images for _, images in rows]
        records = [{**record.extra, "id": record.id, "source": record.source, "count": record.count}
                   for record, _ in rows]
        return TaskBatch(label, prompts, images, answers, answer_token_ids(model, answers), records)

    return batch(loaded[:split], name), batch(loaded[split:], f"{name} (reference)")

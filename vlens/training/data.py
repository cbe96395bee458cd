"""Supervised fine-tuning examples and batches: prompt + answer, answer-only labels, object
centres for L_focus.

A batch is one left-padded sequence per row: the chat-formatted prompt (with its images),
then the answer tokens and the end-of-turn token. Labels are IGNORE_INDEX everywhere but on
the answer tokens (and that closing token, so the model learns to stop). The final prompt
position (the query of L_focus by default) is the position just before the first answer token.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from jaxtyping import Int
from PIL import Image
from torch import Tensor

from vlens.core.answers import answer_ids, end_token_id
from vlens.core.inputs import VLMInputs
from vlens.core.processing import chat_prompt
from vlens.core.prompt_text import escape_special_tokens
from vlens.datasets import load_record_images, read_imagefolder_dataset
from vlens.interventions.focus import FocusPrior, ImageObjects, focus_prior, objects_from_record
from vlens.utils.errors import UserInputError
from vlens.utils.validation import check_count

if TYPE_CHECKING:
    from vlens.core.model import HookedVLM


IGNORE_INDEX = -100


@dataclass
class SFTExample:
    """One question about zero or more images, with its answer.

    objects: per image, (centres [(x, y)] in original pixels, (width, height)); None when the
        example has no object annotations (it then adds nothing to L_focus).
    """

    images: list[Image.Image]
    question: str
    answer: str
    objects: list[ImageObjects] | None = None
    meta: dict = field(default_factory=dict)


def example_from_sample(image: Image.Image, record: dict) -> SFTExample:
    """An `SFTExample` from a vlens.data (image, record) sample (targets' centres as objects)."""
    centres, _ = objects_from_record(record, image.size)
    objects = [(centres, image.size)] if centres else None
    meta = {k: record[k] for k in ("task", "style", "count", "seed") if k in record}
    return SFTExample([image], record["question"], str(record["answer"]), objects, meta)


def examples_from_dataset(dataset, limit: int | None = None) -> list[SFTExample]:
    """SFT examples from any dataset of the shared layer (:func:`vlens.datasets.load_dataset`):
    the question (with its options), the answer text and, when the data has them, object centres
    for L_focus (each image's size read from the image when the data does not give it).
    Records whose images cannot be read are skipped, named in ``dataset.skipped``."""
    limit = check_count(limit, "limit", allow_none=True)
    examples = []
    for record, images in load_record_images(dataset.head(limit)):
        objects: list[ImageObjects] | None = None
        if record.objects:
            objects = [(list(centres), size or image.size) for (centres, size), image in
                       zip(record.objects, images, strict=True)]
        meta = {k: record.extra[k] for k in ("task", "style", "seed") if k in record.extra}
        examples.append(SFTExample(images, record.prompt_text(), record.answer, objects,
                                   {**meta, "count": record.count, "id": record.id, "source": record.source}))
    return examples


def read_sft_folder(folder: str | Path, limit: int | None = None) -> list[SFTExample]:
    """Examples from an imagefolder written by `vlens data` (question, answer, objects)."""
    check_count(limit, "limit", allow_none=True)  # before reading anything
    return examples_from_dataset(read_imagefolder_dataset(folder, limit=limit), limit)


@dataclass
class SFTBatch:
    """Model inputs, labels and the L_focus target of a batch.

    labels: [batch, seq], the token id where the loss applies, IGNORE_INDEX elsewhere
        (labels[b, p] is the token at p, predicted from position p - 1).
    prompt_final: [batch] last prompt position (just before the answer).
    prior: the object prior g, or None when no example has objects.
    """

    inputs: VLMInputs
    labels: Int[Tensor, "batch seq"]
    prompt_final: Int[Tensor, "batch"]
    prior: FocusPrior | None


def answer_ids_with_end(model: HookedVLM, prompt: str, answer: str, example: str = "?") -> list[int]:
    """The ids the answer and the end-of-turn token (tokenizer.eos_token) get *after this prompt*.

    vlens's answer rule (`vlens.core.answers.answer_ids` with the prompt as context, so tokenizers
    that mark word starts give the ids the model generates), then the end-of-turn token. Errors
    name the example for an empty, unknown-token or prompt-merging answer.
    """
    return answer_ids(model, answer, context=prompt, example=example) + [end_token_id(model)]


def example_name(example: SFTExample, index: int) -> str:
    """How errors name an example: its dataset id and source line when it has them."""
    meta = example.meta
    if "id" in meta:
        return f"{meta['id']} ({meta['source']})" if meta.get("source") else str(meta["id"])
    return str(meta.get("seed", index))


def check_answers(model: HookedVLM, examples: Sequence[SFTExample]) -> None:
    """Tokenise every answer before training (tokenizer only, no forward): an answer the tokenizer
    cannot express fails now, naming its example, not at the step whose batch first holds it."""
    for index, example in enumerate(examples):
        prompt = chat_prompt(model, example.question, len(example.images))
        answer_ids_with_end(model, prompt, escape_special_tokens(model.tokenizer, example.answer), example_name(example, index))


def collate(model: HookedVLM, examples: Sequence[SFTExample], sigma: float = 1.0, with_prior: bool = True) -> SFTBatch:
    """Tokenise and pad a batch (left padding, as `model.prepare`)."""
    if not examples:
        raise UserInputError("collate got no examples: pass at least one SFTExample")
    tokenizer = model.tokenizer
    texts, answers = [], []
    for index, example in enumerate(examples):
        prompt = chat_prompt(model, example.question, len(example.images))
        answer = escape_special_tokens(tokenizer, example.answer)  # dataset text stays text
        answers.append(answer_ids_with_end(model, prompt, answer, example=example_name(example, index)))
        texts.append(prompt + answer + tokenizer.eos_token)
    images = [list(example.images) if example.images else None for example in examples]
    inputs = model.prepare(images=images, prompts=texts, chat=False)
    model.adapter.mark_answer_tokens(model.cfg, inputs, [len(ids) for ids in answers])
    labels = torch.full_like(inputs.input_ids, IGNORE_INDEX)
    seq = inputs.seq_len
    for row, ids in enumerate(answers):
        # left padding: every row ends at the last column
        tail = inputs.input_ids[row, seq - len(ids) :].tolist()
        if tail != ids:
            raise UserInputError(
                f"the answer {examples[row].answer!r} ends the processed sequence as {tail}, not {ids}: the "
                "processor tokenises differently from its tokenizer"
            )
        labels[row, seq - len(ids) :] = torch.tensor(ids)
    prompt_final = torch.tensor(
        [seq - len(ids) - 1 for ids in answers], dtype=torch.long, device=inputs.input_ids.device
    )
    prior = None
    if with_prior and any(example.objects for example in examples):
        prior = focus_prior(inputs, [example.objects for example in examples], sigma=sigma, model=model)
    return SFTBatch(inputs, labels.to(inputs.input_ids.device), prompt_final, prior)


def answer_loss(logits: Tensor, labels: Tensor) -> Tensor:
    """Mean cross-entropy over the answer tokens of the batch (fp32)."""
    shifted = logits[:, :-1].float()
    targets = labels[:, 1:]
    if not bool((targets != IGNORE_INDEX).any()):
        raise UserInputError("the batch has no answer tokens to train on: give every example a non-empty answer")
    return torch.nn.functional.cross_entropy(
        shifted.reshape(-1, shifted.shape[-1]), targets.reshape(-1), ignore_index=IGNORE_INDEX
    )

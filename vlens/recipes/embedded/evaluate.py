"""Held-out accuracy of a VLM on task records, by greedy generation (HF `generate` through
`vlens.evaluation.HFBackend`)."""

from __future__ import annotations

from collections import defaultdict

from PIL import Image

from vlens.evaluation.backends import HFBackend
from vlens.utils.errors import UserInputError


def answer_questions(
    model,
    processor,
    images: list[Image.Image],
    questions: list[str],
    batch_size: int = 64,
    max_new_tokens: int = 4,
    question_first: bool = False,
) -> list[str]:
    """Greedy answers (decoded without special tokens, stripped) to one question per image
    (asked after the image; `question_first`: before it)."""
    if len(images) != len(questions):
        raise UserInputError(f"{len(images)} images but {len(questions)} questions")
    backend = HFBackend(model, processor, text_first=question_first)
    answers: list[str] = []
    for start in range(0, len(images), batch_size):
        batch = [[image] for image in images[start : start + batch_size]]
        answers += backend.generate(batch, questions[start : start + batch_size], max_new_tokens)
    return answers


def is_correct(prediction: str, record: dict) -> bool:
    """Exact match of a greedy answer with the record's answer, ignoring case and surrounding space."""
    return prediction.strip().lower() == str(record["answer"]).strip().lower()


def accuracy_report(records: list[dict], predictions: list[str], group_key: str = "source") -> dict:
    """Exact-match accuracy per group (record[group_key], else record["task"]), per true
    count (the answer) for counting groups, and per number of objects in the image for the
    other groups whose records list their "objects" (how accuracy falls with distractors).

    Returns {"per_task": {group: {"accuracy", "n"}},
             "per_count": {counting group: {count: {"accuracy", "n"}}},
             "per_objects": {other group: {n_objects: {"accuracy", "n"}}}}.
    """
    hits: dict[str, list[bool]] = defaultdict(list)
    count_hits: dict[str, dict[int, list[bool]]] = defaultdict(lambda: defaultdict(list))
    object_hits: dict[str, dict[int, list[bool]]] = defaultdict(lambda: defaultdict(list))
    for record, prediction in zip(records, predictions, strict=True):
        group = record.get(group_key, record["task"])
        correct = is_correct(prediction, record)
        hits[group].append(correct)
        if record["task"] == "counting":
            count_hits[group][int(record["answer"])].append(correct)
        elif "objects" in record:
            object_hits[group][len(record["objects"])].append(correct)

    def summary(values: list[bool]) -> dict:
        return {"accuracy": sum(values) / len(values), "n": len(values)}

    def breakdown(grouped: dict[str, dict[int, list[bool]]]) -> dict:
        return {
            group: {key: summary(values) for key, values in sorted(by_key.items())}
            for group, by_key in sorted(grouped.items())
        }

    return {
        "per_task": {group: summary(values) for group, values in sorted(hits.items())},
        "per_count": breakdown(count_hits),
        "per_objects": breakdown(object_hits),
    }


def evaluate_samples(
    model, processor, samples: list[tuple[Image.Image, dict]], batch_size: int = 64, question_first: bool = False
) -> dict:
    """`accuracy_report` of greedy answers on (image, record) samples, each question asked after
    its image (the recipe's default order) or, with `question_first`, before it."""
    images = [image for image, _ in samples]
    records = [record for _, record in samples]
    questions = [r["question"] for r in records]
    predictions = answer_questions(model, processor, images, questions, batch_size, question_first=question_first)
    return accuracy_report(records, predictions)

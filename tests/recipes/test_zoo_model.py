"""The shipped embedded model: a normal HF folder (<= 20 MB) that plain transformers and
`vlens.load()` run, and that answers the task templates on held-out images."""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen2_5_VLForConditionalGeneration

from vlens.data import COLOR_PALETTE, REAL_SHAPES, SHAPES
from vlens.recipes.embedded.evaluate import answer_questions
from vlens.recipes.embedded.training_set import held_out_samples
from vlens.zoo import model_path
from vlens.zoo.processor import load_processor

MAX_FOLDER_BYTES = 20 * 1024 * 1024


@pytest.fixture(scope="module")
def hf_model_and_processor():
    torch.set_num_threads(1)
    folder = model_path()
    model = Qwen2_5_VLForConditionalGeneration.from_pretrained(folder).eval()
    return model, load_processor(folder)


def test_folder_is_a_small_complete_hf_folder():
    folder = model_path()
    names = {path.name for path in folder.iterdir()}
    assert {
        "config.json",
        "model.safetensors",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "preprocessor_config.json",
        "chat_template.jinja",
        "MODEL_CARD.md",
    } <= names
    assert sum(path.stat().st_size for path in folder.rglob("*") if path.is_file()) <= MAX_FOLDER_BYTES


def test_plain_transformers_counts_held_out_dots(hf_model_and_processor):
    model, processor = hf_model_and_processor
    samples = held_out_samples(20, ["counting/syndot"])  # counts 1..10, twice, unseen seeds
    answers = answer_questions(
        model, processor, [image for image, _ in samples], [r["question"] for _, r in samples]
    )
    assert all(answer.isdigit() for answer in answers), answers
    correct = sum(answer == record["answer"] for answer, (_, record) in zip(answers, samples, strict=True))
    assert correct >= 18, (answers, [record["answer"] for _, record in samples])


def test_every_task_template_gets_an_answer_of_the_right_kind(hf_model_and_processor):
    """Format only: how often the answers are right is MODEL_CARD.md's held-out table."""
    model, processor = hf_model_and_processor
    sources = ["counting/synpoly", "colour", "shape", "spatial", "arithmetic", "existence"]
    samples = held_out_samples(4, sources)
    answers = answer_questions(
        model, processor, [image for image, _ in samples], [r["question"] for _, r in samples]
    )
    kinds = {
        "counting/synpoly": str.isdigit,
        "arithmetic": str.isdigit,
        "colour": lambda a: a in COLOR_PALETTE,
        "shape": lambda a: a in set(SHAPES) | set(REAL_SHAPES),
        "spatial": lambda a: a in {"yes", "no"},
        "existence": lambda a: a in {"yes", "no"},
    }
    for answer, (_, record) in zip(answers, samples, strict=True):
        assert kinds[record["source"]](answer), (record["question"], answer)


def test_vlens_load_generates_the_count():
    import vlens

    model = vlens.load()
    ((image, record),) = held_out_samples(1, ["counting/syndot"])  # 1 dot
    (image3, record3) = held_out_samples(3, ["counting/syndot"])[2]  # 3 dots
    out = model.generate(
        model.prepare(images=[image, image3], prompts=[record["question"]] * 2), max_new_tokens=4
    )
    assert out.texts == [record["answer"], record3["answer"]] == ["1", "3"]

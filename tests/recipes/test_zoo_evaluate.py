"""Held-out accuracy bookkeeping of the embedded model, on hand-computed cases."""

from __future__ import annotations

import pytest

from vlens.recipes.embedded.evaluate import accuracy_report
from vlens.recipes.embedded.model_card import objects_section


def _record(task: str, answer: str, n_objects: int, source: str | None = None) -> dict:
    record = {"task": task, "answer": answer, "objects": [{}] * n_objects}
    return record if source is None else {**record, "source": source}


def test_accuracy_per_task_per_count_and_per_number_of_objects():
    records = [
        _record("counting", "3", 3, "counting/syndot"),
        _record("counting", "3", 3, "counting/syndot"),
        _record("counting", "5", 5, "counting/syndot"),
        _record("colour", "red", 1),
        _record("colour", "blue", 1),
        _record("colour", "green", 3),
    ]
    predictions = ["3", "4", "5", "red", " Blue ", "red"]
    report = accuracy_report(records, predictions)
    assert report["per_task"]["counting/syndot"] == {"accuracy": pytest.approx(2 / 3), "n": 3}
    assert report["per_task"]["colour"] == {"accuracy": pytest.approx(2 / 3), "n": 3}
    assert report["per_count"] == {
        "counting/syndot": {3: {"accuracy": 0.5, "n": 2}, 5: {"accuracy": 1.0, "n": 1}}
    }
    # counting is broken down by its answer, the other tasks by objects in the image
    assert report["per_objects"] == {"colour": {1: {"accuracy": 1.0, "n": 2}, 3: {"accuracy": 0.0, "n": 1}}}


def test_objects_section_of_the_model_card():
    assert objects_section({}) == []
    lines = objects_section({"colour": {1: {"accuracy": 1.0, "n": 2}, 3: {"accuracy": 0.0, "n": 1}}})
    assert "| source | 1 | 3 |" in lines
    assert "| colour | 100% (2) | 0% (1) |" in lines


def test_training_lines_name_the_device_and_the_vision_objective():
    from vlens.recipes.embedded.model_card import training_lines

    stage = {
        "seed": 1,
        "steps": 10,
        "schedule_steps": 10,
        "batch_size": 4,
        "learning_rate": 0.001,
        "warmup_steps": 1,
        "threads": 1,
        "wall_time_s": 60.0,
        "final_loss": 0.5,
        "device": "cuda",
        "vision_aux_weight": 0.5,
    }
    summary = {"training": stage, "data": {"n_examples": 100, "mix": {"colour": 1.0}, "max_objects": 2}}
    text = "\n".join(training_lines(summary))
    assert "1 torch thread(s) on cuda" in text and "(devices as listed)" in text
    assert "--max-objects 2 --vision-aux-weight 0.5 --device cuda" in text
    assert "plus the vision-token loss" in text and "dense vision-token shape/colour loss (weight 0.5" in text


def test_rewriting_a_card_keeps_the_sections_other_commands_added(tmp_path):
    """`vlens zoo evaluate --write` re-renders the card from evaluation.json; the interventions study's
    section (vlens study --model-card), which the summary does not hold, must survive it."""
    import shutil
    from pathlib import Path

    from vlens.recipes.embedded.model_card import added_sections, rewrite_model_card
    from vlens.studies.interventions import CARD_BEGIN, CARD_END

    shipped = Path(__file__).resolve().parents[2] / "vlens" / "zoo" / "weights" / "tiny-qwen2.5-vl"
    shutil.copy(shipped / "evaluation.json", tmp_path / "evaluation.json")
    study = f"{CARD_BEGIN}\n## A study\n| a | b |\n{CARD_END}"
    other = "<!-- vlens:another -->\nmore\n<!-- /vlens:another -->"
    (tmp_path / "MODEL_CARD.md").write_text(f"old text\n\n{study}\n\nbetween\n\n{other}\n")
    text = rewrite_model_card(tmp_path).read_text()
    assert "old text" not in text and "between" not in text  # the rest is re-rendered
    assert added_sections(text) == [study, other]
    assert rewrite_model_card(tmp_path).read_text() == text  # a second rewrite keeps each section once
    assert text.index("## Limits") < text.index(CARD_BEGIN) < text.index("<!-- vlens:another -->")

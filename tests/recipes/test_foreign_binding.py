"""The foreign renderer's existence and spatial questions (vlens.recipes.embedded.foreign): each answer is
the one the drawn objects give, both answers occur, and no training stage may use them."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest

from vlens.recipes.embedded.foreign import CSS_COLOURS, FOREIGN_TASKS, foreign_sample
from vlens.recipes.embedded.training_set import HELD_OUT_ONLY, held_out_samples, parse_mix
from vlens.utils.errors import UserInputError


def _named(question: str) -> str:
    return question.removeprefix("Is there a ").removesuffix(" object?").removesuffix("?")


def test_existence_answers_yes_exactly_when_a_drawn_object_has_the_named_shape_or_colour():
    answers = Counter()
    for seed in range(60):
        image, record = foreign_sample("existence", seed)
        named = _named(record["question"])
        key = "color" if named in CSS_COLOURS else "shape"
        present = any(obj[key] == named for obj in record["objects"])
        assert record["answer"] == ("yes" if present else "no"), record
        assert 1 <= len(record["objects"]) <= 5 and min(image.size) >= 160
        answers[record["answer"], key] += 1
    assert all(answers[answer, key] >= 5 for answer in ("yes", "no") for key in ("color", "shape"))


def test_spatial_asks_about_two_objects_clearly_apart_and_answers_from_their_centres():
    answers = Counter()
    for seed in range(60):
        _, record = foreign_sample("spatial", seed)
        a, b = (record["objects"][i] for i in record["pair"])
        axis = 0 if " left of " in record["question"] else 1
        assert record["question"].startswith(f"Is the {a['color']} {a['shape']} ")
        assert record["question"].endswith(f" the {b['color']} {b['shape']}?")
        assert abs(a["center"][axis] - b["center"][axis]) >= a["size"] + b["size"]  # no borderline answer
        assert record["answer"] == ("yes" if a["center"][axis] < b["center"][axis] else "no")
        combos = {(obj["color"], obj["shape"]) for obj in record["objects"]}
        assert len(combos) == len(record["objects"])  # "the red star" names one object
        answers[record["answer"], axis] += 1
    assert all(answers[answer, axis] >= 5 for answer in ("yes", "no") for axis in (0, 1))


def test_objects_do_not_overlap_and_the_samples_are_deterministic():
    for task in ("existence", "spatial"):
        for seed in range(20):
            image, record = foreign_sample(task, seed)
            again, same = foreign_sample(task, seed)
            assert same == record and np.array_equal(np.asarray(image), np.asarray(again))
            objects = record["objects"]
            for i, a in enumerate(objects):
                for b in objects[i + 1:]:
                    assert math.dist(a["center"], b["center"]) > a["size"] + b["size"]


def test_the_new_sources_are_held_out_of_training_and_evaluated_last():
    assert {"foreign/existence", "foreign/spatial"} <= set(HELD_OUT_ONLY)
    assert set(FOREIGN_TASKS) == {source.removeprefix("foreign/") for source in HELD_OUT_ONLY}
    with pytest.raises(ValueError, match="held out of every training stage"):
        parse_mix("foreign/spatial=1")
    with pytest.raises(UserInputError, match="existence, spatial, not 'size'"):
        foreign_sample("size", 0)
    samples = held_out_samples(4, ["foreign/existence", "foreign/spatial"])
    assert [record["source"] for _, record in samples] == ["foreign/existence"] * 4 + ["foreign/spatial"] * 4

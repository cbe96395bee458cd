"""Task suites: every answer follows from the objects, in the documented templates' words."""

import re

import pytest

from vlens.data import TASKS, TEMPLATES, all_template_words, make_task_sample, plural, task_templates


def expected_answer(rec: dict) -> str:
    """Recompute the answer from the record's objects and the filled template."""
    objs, template = rec["objects"], rec["template"]
    pattern = "^" + re.sub(r"\\\{(\w+)\\\}", r"(?P<\1>\\w+)", re.escape(template)) + "$"
    v = re.match(pattern, rec["question"]).groupdict()
    n_color = lambda c: sum(o["color"] == c for o in objs)  # noqa: E731
    if template in ("How many dots are there?", "How many objects are there?"):
        return str(len(objs))
    if "shape_plural" in v:
        return str(sum(plural(o["shape"]) == v["shape_plural"] for o in objs))
    if template == "How many {color} objects are there?":
        return str(n_color(v["color"]))
    if rec["task"] == "colour":
        (target,) = [o for o in objs if o["shape"] == v["shape"]]
        return target["color"]
    if rec["task"] == "shape":
        (target,) = [o for o in objs if o["color"] == v["color"]]
        return target["shape"]
    if rec["task"] == "spatial":
        (a,) = [o for o in objs if (o["color"], o["shape"]) == (v["color"], v["shape"])]
        (b,) = [o for o in objs if (o["color"], o["shape"]) == (v["color2"], v["shape2"])]
        axis = 0 if "left" in template else 1
        assert abs(a["center"][axis] - b["center"][axis]) >= a["size"] + b["size"]
        return "yes" if a["center"][axis] < b["center"][axis] else "no"
    if "total" in template:
        return str(n_color(v["color"]) + n_color(v["color2"]))
    if "more" in template:
        return str(n_color(v["color"]) - n_color(v["color2"]))
    if "shape" in v:
        return "yes" if any(o["shape"] == v["shape"] for o in objs) else "no"
    return "yes" if n_color(v["color"]) else "no"


@pytest.mark.parametrize("style", ["synpoly", "synreal"])
@pytest.mark.parametrize("task", TASKS)
def test_answers_follow_from_objects(task, style):
    vocab = all_template_words()
    answers = set()
    for seed in range(12):
        img, rec = make_task_sample(task, seed=seed, size=160, style=style)
        assert img.size == (160, 160) and rec["task"] == task
        assert rec["template"] in TEMPLATES[task]
        assert rec["answer"] == expected_answer(rec)
        assert re.fullmatch(r"[a-z]+|\d+", rec["answer"])
        assert set(re.findall(r"[a-z0-9]+", rec["question"].lower())) <= vocab
        assert rec["answer"] in vocab
        assert 1 <= rec["count"] <= 10
        answers.add(rec["answer"])
    if task in ("spatial", "existence"):
        assert answers == {"yes", "no"}


def test_every_template_is_reachable_and_deterministic():
    for task in TASKS:
        for template in task_templates(task, "synpoly"):
            a = make_task_sample(task, seed=3, template=template, size=128)[1]
            assert a == make_task_sample(task, seed=3, template=template, size=128)[1]
            assert a["template"] == template
    assert task_templates("counting", "syndot") == ("How many dots are there?",)


def test_vocabulary_and_bad_requests():
    words = all_template_words()
    assert {"how", "many", "colour", "left", "yes", "no", "red", "star", "stars", "10", "0"} <= words
    assert all(w == w.lower() and w.isalnum() for w in words)
    with pytest.raises(ValueError, match="synpoly"):
        make_task_sample("colour", seed=0, style="syndot")
    with pytest.raises(ValueError, match="unknown task"):
        make_task_sample("reading", seed=0)
    with pytest.raises(ValueError, match="templates"):
        make_task_sample("shape", seed=0, template="Is there a {shape}?")
    rec = make_task_sample("counting", seed=0, style="syndot", counts=[4], size=128)[1]
    assert rec["question"] == "How many dots are there?" and rec["answer"] == "4"


@pytest.mark.parametrize("template", ["How many {color} objects are there?", "How many {shape_plural} are there?"])
def test_counting_among_a_fixed_number_of_distractors(template):
    for seed, (answer, distractors) in enumerate([(1, 0), (1, 9), (4, 3), (7, 2), (10, 1)]):
        rec = make_task_sample("counting", seed=seed, size=224, counts=[answer], template=template,
                               distractors=distractors)[1]
        assert rec["answer"] == str(answer) == expected_answer(rec)
        assert rec["distractors"] == distractors and len(rec["objects"]) == answer + distractors
        assert len(rec["targets"]) == answer  # the distractors are exactly the objects not asked about
    plain = make_task_sample("counting", seed=0, size=224, counts=[4], template=template)[1]
    assert "distractors" not in plain and len(plain["objects"]) == 4  # a fixed count draws none by default


def test_distractors_only_where_a_question_counts_a_subset():
    with pytest.raises(ValueError, match="counting by colour or shape"):
        make_task_sample("counting", seed=0, template="How many objects are there?", distractors=2)
    with pytest.raises(ValueError, match="counting by colour or shape"):
        make_task_sample("existence", seed=0, distractors=2)
    for bad in (-1, 2.5, True):
        with pytest.raises(ValueError, match="non-negative integer"):
            make_task_sample("counting", seed=0, template="How many {color} objects are there?", distractors=bad)


def test_distractor_kinds_group_the_distractors_into_that_many_other_values():
    template = "How many {color} objects are there?"
    for seed in range(6):
        image, rec = make_task_sample("counting", seed=seed, size=224, counts=[2], template=template, distractors=6,
                                      distractor_kinds=1)
        asked = {o["color"] for o in rec["objects"] if o["id"] in rec["targets"]}
        others = [o["color"] for o in rec["objects"] if o["id"] not in rec["targets"]]
        assert len(asked) == 1 and len(others) == 6 and len(set(others)) == 1 and not asked & set(others)
        assert rec["answer"] == "2" and rec["distractor_kinds"] == 1
    two = make_task_sample("counting", seed=3, size=224, counts=[1], template="How many {shape_plural} are there?",
                           distractors=8, distractor_kinds=2)[1]
    assert len({o["shape"] for o in two["objects"] if o["id"] not in two["targets"]}) <= 2
    with pytest.raises(ValueError, match="give distractors too"):
        make_task_sample("counting", seed=0, template=template, distractor_kinds=1)
    with pytest.raises(ValueError, match="positive integer or None"):
        make_task_sample("counting", seed=0, template=template, distractors=2, distractor_kinds=0)
    plain = make_task_sample("counting", seed=0, size=224, counts=[2], template=template, distractors=3)[1]
    assert "distractor_kinds" not in plain  # without it the draw is unchanged (each distractor on its own)

"""The v4 recipe's binding changes: minimal pairs and an M-RoPE both image axes can use."""

from __future__ import annotations

import math

import numpy as np
import pytest

from vlens.data import make_task_sample
from vlens.data import templates as T
from vlens.data.palette import COLOR_PALETTE, SHAPES, plural
from vlens.recipes.embedded.architecture import axis_rotations, build_config
from vlens.recipes.embedded.minimal_pairs import counterpart
from vlens.recipes.embedded.tokenizer import build_tokenizer
from vlens.recipes.embedded.train import with_partners
from vlens.recipes.embedded.vocabulary import vocabulary_words
from vlens.utils.errors import UserInputError


def _truth(record: dict, question: str) -> str:
    """The answer to `question` about the record's scene, derived independently of counterpart()."""
    objects = record["objects"]
    for obj in objects:
        for other in objects:
            if other is obj:
                continue
            for template, axis in ((T.LEFT_OF, 0), (T.ABOVE, 1)):
                filled = T.fill(template, color=obj["color"], shape=obj["shape"],
                                color2=other["color"], shape2=other["shape"])
                if filled == question:
                    return T.YES if obj["center"][axis] < other["center"][axis] else T.NO
    for obj in objects:
        if question == T.fill(T.COLOUR_OF_SHAPE, shape=obj["shape"]):
            return obj["color"]
        if question == T.fill(T.SHAPE_OF_COLOR, color=obj["color"]):
            return obj["shape"]
    shapes, colours = {o["shape"] for o in objects}, {o["color"] for o in objects}
    for shape in set(SHAPES) | shapes:
        if question == T.fill(T.EXISTS_SHAPE, shape=shape):
            return T.YES if shape in shapes else T.NO
    for colour in COLOR_PALETTE:
        if question == T.fill(T.EXISTS_COLOR, color=colour):
            return T.YES if colour in colours else T.NO
    raise AssertionError(f"no rule for {question!r}")


@pytest.mark.parametrize("task", ["existence", "spatial", "colour", "shape"])
def test_counterparts_ask_about_the_same_image_and_are_answered_correctly(task):
    made = flipped = 0
    for seed in range(40):
        _, record = make_task_sample(task, seed, size=168)
        pair = counterpart(record, np.random.default_rng(seed))
        if pair is None:
            continue
        question, answer = pair
        made += 1
        assert question != record["question"]
        assert answer == _truth(record, question), (record, pair)
        flipped += answer != record["answer"]
    assert made >= 20  # most samples have a partner
    if task in ("existence", "spatial"):
        assert flipped == made  # the partner's yes/no answer is always the other one


def _count_truth(record: dict, question: str) -> str:
    """How many of the scene's objects the counting question names, from the objects alone."""
    for key, template in (("color", T.COUNT_COLOR), ("shape", T.COUNT_SHAPE)):
        for value in {o[key] for o in record["objects"]}:
            if question == T.fill(template, color=value, shape_plural=plural(value)):
                return str(sum(o[key] == value for o in record["objects"]))
    raise AssertionError(f"no object matches {question!r}")


@pytest.mark.parametrize("template", [T.COUNT_COLOR, T.COUNT_SHAPE])
def test_counting_among_distractors_pairs_with_another_present_value(template):
    for seed in range(30):
        _, record = make_task_sample("counting", seed, size=224, counts=[1 + seed % 6], template=template,
                                     distractors=1 + seed % 4)
        question, answer = counterpart(record, np.random.default_rng(seed))
        assert question != record["question"] and int(answer) >= 1
        assert answer == _count_truth(record, question)
    _, record = make_task_sample("counting", 0, size=224, counts=[3], template=template, distractors=0)
    assert counterpart(record, np.random.default_rng(0)) is None  # nothing else to count


@pytest.mark.parametrize("template", [T.COUNT_COLOR, T.COUNT_SHAPE])
def test_group_counting_pairs_with_the_other_groups_count(template):
    for seed in range(12):
        _, record = make_task_sample("counting", seed, size=224, counts=[1 + seed % 4], template=template,
                                     distractors=2 + seed % 5, distractor_kinds=1)
        question, answer = counterpart(record, np.random.default_rng(seed))
        assert answer == str(record["distractors"]) == _count_truth(record, question)


def test_arithmetic_pairs_ask_the_other_operation_about_the_same_colours():
    for template in (T.SUM_OF_COLORS, T.DIFFERENCE_OF_COLORS):
        for seed in range(15):
            _, record = make_task_sample("arithmetic", seed, size=224, template=template)
            assert counterpart(record, np.random.default_rng(0)) is None  # only when asked for
            question, answer = counterpart(record, np.random.default_rng(0), arithmetic=True)
            colours = [o["color"] for o in record["objects"]]
            other = T.DIFFERENCE_OF_COLORS if template == T.SUM_OF_COLORS else T.SUM_OF_COLORS
            named = [(a, b) for a in set(colours) for b in set(colours)
                     if a != b and question == T.fill(other, color=a, color2=b)]
            assert len(named) == 1, question
            a, b = named[0]
            asked = {c for c in colours if c in record["question"].split()}
            assert {a, b} == asked  # the same two colours
            expected = colours.count(a) - colours.count(b) if other == T.DIFFERENCE_OF_COLORS else (
                colours.count(a) + colours.count(b))
            assert answer == str(expected) and int(answer) >= 0  # a difference names the larger group first


def test_arithmetic_pairs_need_minimal_pairs_and_leave_older_fingerprints_alone():
    from vlens.recipes.embedded.recipe import check_settings, fingerprint
    from vlens.recipes.embedded.settings import RecipeSettings

    with pytest.raises(ValueError, match="give --minimal-pairs too"):
        check_settings(RecipeSettings(arithmetic_pairs=True))
    check_settings(RecipeSettings(minimal_pairs=True, arithmetic_pairs=True))
    before = fingerprint(RecipeSettings(minimal_pairs=True))
    assert "arithmetic_pairs" not in before  # states saved before the option still resume
    paired = fingerprint(RecipeSettings(minimal_pairs=True, arithmetic_pairs=True))
    assert paired["arithmetic_pairs"] is True and {k: v for k, v in paired.items() if k != "arithmetic_pairs"} == before


def test_no_counterpart_for_a_lone_object_or_counting():
    for seed in range(40):
        _, record = make_task_sample("colour", seed, size=168)
        if len(record["objects"]) == 1:
            assert counterpart(record, np.random.default_rng(0)) is None
            break
    else:
        pytest.fail("no lone-object colour sample in 40 seeds")
    for seed in range(20):  # counting drawn without explicit distractors: no partner (older stages unchanged)
        _, record = make_task_sample("counting", seed, size=168)
        assert counterpart(record, np.random.default_rng(0)) is None


def test_batches_put_each_example_next_to_its_partner():
    partners = [1, 0, None, 4, 3, None]
    assert with_partners([0, 3, 2, 5, 2, 1], partners) == [0, 1, 3, 4, 2, 1]
    assert with_partners([2, 0, 5], partners) == [2, 5, 0]  # odd batch: same length


def test_the_new_rope_rotates_both_image_axes():
    old = axis_rotations(10_000.0, [2, 3, 3], d_head=16, grid=6)
    assert math.isclose(old["width"], 5 * 10_000 ** (-10 / 16)) and old["width"] < 0.02
    new = axis_rotations(30.0, [2, 2, 4], d_head=16, grid=6)
    assert new["width"] > 0.5 and new["height"] > 0.5
    assert max(new.values()) < math.pi  # no axis wraps round across the grid


def test_build_config_takes_the_rope_and_checks_the_section():
    tokenizer = build_tokenizer(vocabulary_words())
    config = build_config(tokenizer, rope_theta=30.0, mrope_section=[2, 2, 4])
    assert config.text_config.rope_parameters["rope_theta"] == 30.0
    assert config.text_config.rope_parameters["mrope_section"] == [2, 2, 4]
    with pytest.raises(UserInputError, match="summing to d_head / 2 = 8"):
        build_config(tokenizer, mrope_section=[2, 2, 2])


def _card_commands(card: str) -> list[str]:
    return [line for line in card.splitlines() if line.startswith("vlens zoo train ")]


@pytest.mark.parametrize("card", ["vlens/zoo/weights/tiny-qwen2.5-vl/MODEL_CARD.md",
                                  "training/v3/stage1/MODEL_CARD.md"])
def test_model_card_commands_parse(card):
    """A model card's commands reproduce its model: every stage's command line is accepted
    (the --mix of the shipped stages names counting/dot_variants)."""
    import shlex
    from pathlib import Path

    from vlens.cli import build_parser

    commands = _card_commands((Path(__file__).parents[2] / card).read_text())
    assert len(commands) >= 1
    parser = build_parser()
    for command in commands:
        args = parser.parse_args(shlex.split(command)[1:])
        if args.mix:
            from vlens.recipes.embedded.training_set import parse_mix

            assert parse_mix(args.mix)


def test_fresh_decoder_stage_keeps_the_tower_and_takes_the_new_rope(tmp_path):
    """`zoo train --init-from F --fresh-decoder --rope-theta 30 --mrope-section 2,2,4
    --minimal-pairs`: the tower and merger are F's, the decoder is new with the given M-RoPE and
    depth, and the run (minimal-pair batches, tower frozen) trains and writes its folder."""
    import json

    import torch
    from safetensors.torch import load_file

    from vlens.cli import main

    tiny = ("--image-size 56 --examples 6 --batch-size 4 --steps 2 --warmup 1 --held-out 1 "
            "--probe-scenes 6 --checkpoint-every 2 --log-every 1 --threads 1 --quiet").split()
    donor, out = tmp_path / "donor", tmp_path / "v4"
    assert main(["zoo", "train", "--stage", "vision", "--out", str(donor), "--seed", "1", *tiny]) == 0
    argv = ["zoo", "train", "--out", str(out), "--seed", "3", "--init-from", str(donor), "--fresh-decoder",
            "--rope-theta", "30", "--mrope-section", "2,2,4", "--text-layers", "2", "--minimal-pairs",
            "--freeze-vision", "--mix", "existence=1", *tiny]
    assert main(argv) == 0
    config = json.loads((out / "config.json").read_text())["text_config"]
    assert config["rope_parameters"]["rope_theta"] == 30.0
    assert config["rope_parameters"]["mrope_section"] == [2, 2, 4] and config["num_hidden_layers"] == 2
    before, after = load_file(donor / "model.safetensors"), load_file(out / "model.safetensors")
    for name, tensor in after.items():
        if name.startswith("visual."):
            assert torch.equal(tensor, before[name]), name
    layers = {name.split(".")[2] for name in after if name.startswith("model.layers.")}
    assert layers == {"0", "1"}


def test_decoder_flags_need_a_decoder_built_here(tmp_path, capsys):
    from vlens.cli import main

    donor = tmp_path / "donor"  # beside --out (an --out inside an input is its own error)
    donor.mkdir()
    assert main(["zoo", "train", "--out", str(tmp_path / "o"), "--init-from", str(donor),
                 "--rope-theta", "30"]) == 2
    assert "--fresh-decoder" in capsys.readouterr().err
    assert main(["zoo", "train", "--out", str(tmp_path / "o"), "--fresh-decoder"]) == 2
    assert "needs --init-from" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["zoo", "train", "--out", str(tmp_path / "o"), "--mrope-section", "2,2"])


def test_vision_from_puts_another_tower_under_the_decoder(tmp_path, capsys):
    """`zoo train --init-from A --vision-from T --freeze-vision`: the stage trains A's decoder on
    T's tower and merger (copied, then kept), its card reproduces T's stage too, and a
    tower of another architecture is refused with what differs."""
    import json

    import torch
    from safetensors.torch import load_file

    from vlens.cli import main

    tiny = ("--image-size 56 --examples 6 --batch-size 4 --steps 2 --warmup 1 --held-out 1 "
            "--probe-scenes 6 --checkpoint-every 2 --log-every 1 --threads 1 --quiet").split()
    first, second, decoder, out = (tmp_path / name for name in ("tower1", "tower2", "decoder", "out"))
    assert main(["zoo", "train", "--stage", "vision", "--out", str(first), "--seed", "1", *tiny]) == 0
    assert main(["zoo", "train", "--stage", "vision", "--out", str(second), "--seed", "2", *tiny]) == 0
    assert main(["zoo", "train", "--out", str(decoder), "--seed", "3", "--init-from", str(first), "--fresh-decoder",
                 "--text-layers", "2", "--freeze-vision", "--mix", "existence=1", *tiny]) == 0
    assert main(["zoo", "train", "--out", str(out), "--seed", "4", "--init-from", str(decoder), "--vision-from",
                 str(second), "--freeze-vision", "--mix", "existence=1", *tiny]) == 0
    tower, before, after = (load_file(folder / "model.safetensors") for folder in (second, decoder, out))
    visual = [name for name in after if name.startswith("visual.")]
    assert visual and all(torch.equal(after[name], tower[name]) for name in visual)
    assert any(not torch.equal(after[name], before[name]) for name in visual)  # not the decoder's old tower
    assert not all(torch.equal(after[name], before[name]) for name in after if name not in visual)  # trained on
    record = json.loads((out / "evaluation.json").read_text())["training"]
    assert record["vision_from"] == str(second) and [s["seed"] for s in record["vision_from_stages"]] == [2]
    card = (out / "MODEL_CARD.md").read_text()
    assert "--out stage3-tower-stage1 --stage vision --seed 2" in card
    assert "--init-from stage2 --vision-from stage3-tower-stage1" in card

    grown = tmp_path / "grown"
    assert main(["zoo", "train", "--stage", "vision", "--out", str(grown), "--seed", "5", "--init-from", str(first),
                 "--grow-vision-depth", "5", *tiny]) == 0
    capsys.readouterr()
    assert main(["zoo", "train", "--out", str(tmp_path / "x"), "--init-from", str(decoder), "--vision-from",
                 str(grown), "--freeze-vision", *tiny]) == 2
    assert "its vision tower differs from --init-from's in depth" in capsys.readouterr().err
    assert main(["zoo", "train", "--out", str(tmp_path / "x"), "--vision-from", str(second)]) == 2
    assert "needs --init-from" in capsys.readouterr().err
    assert main(["zoo", "train", "--out", str(tmp_path / "x"), "--init-from", str(decoder), "--fresh-decoder",
                 "--vision-from", str(second)]) == 2
    assert "not with --fresh-decoder" in capsys.readouterr().err

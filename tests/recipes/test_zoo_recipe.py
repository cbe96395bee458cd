"""A 20-step smoke run of the embedded model's recipe (CI never retrains for real): the
folder it writes is a normal HF model folder, and training is deterministic."""

from __future__ import annotations

import json

import pytest
import torch
from PIL import Image
from transformers import Qwen2_5_VLForConditionalGeneration

from vlens.cli import main
from vlens.recipes.embedded.loop import rate_at
from vlens.recipes.embedded.recipe import build_untrained
from vlens.recipes.embedded.train import TrainSettings, train_model
from vlens.recipes.embedded.training_set import (
    held_out_samples,
    parse_mix,
    render_training_set,
    source_makers,
    training_sources,
)
from vlens.utils.errors import UserInputError


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    """`vlens zoo train` for 20 steps on 32 examples (the recipe's CI check)."""
    out = tmp_path_factory.mktemp("zoo_smoke")
    threads = torch.get_num_threads()
    options = "--seed 3 --steps 20 --batch-size 4 --examples 32 --warmup 5 --held-out 1 --log-every 1"
    options += " --image-size 112 --probe-scenes 6"
    argv = ["zoo", "train", "--out", str(out), *options.split(), "--threads", "1", "--quiet"]
    try:
        assert main(argv) == 0
    finally:
        torch.set_num_threads(threads)
    return out, json.loads((out / "evaluation.json").read_text())


def test_smoke_run_writes_a_loadable_model_folder(smoke_run):
    out, summary = smoke_run
    for name in (
        "config.json",
        "model.safetensors",
        "generation_config.json",
        "tokenizer.json",
        "preprocessor_config.json",
        "chat_template.jinja",
        "MODEL_CARD.md",
        "training_log.jsonl",
    ):
        assert (out / name).is_file(), name
    model = Qwen2_5_VLForConditionalGeneration.from_pretrained(out)
    assert model.config.model_type == "qwen2_5_vl"
    assert model.config.text_config.num_key_value_heads < model.config.text_config.num_attention_heads
    assert summary["parameters"] == sum(p.numel() for p in model.parameters())
    card = (out / "MODEL_CARD.md").read_text()
    assert "Held-out accuracy" in card and "counting/syndot" in card and "per count" in card


def test_smoke_run_logs_every_step_and_the_loss_falls(smoke_run):
    out, _ = smoke_run
    records = [json.loads(line) for line in (out / "training_log.jsonl").read_text().splitlines()]
    steps = [r for r in records if "step" in r and "loss" in r]
    assert [r["step"] for r in steps] == list(range(1, 21))
    first = sum(r["loss"] for r in steps[:3]) / 3
    last = sum(r["loss"] for r in steps[-3:]) / 3
    assert last < first
    assert records[-1]["event"] == "final"


def test_training_is_deterministic_for_a_seed():
    def three_steps() -> dict[str, torch.Tensor]:
        torch.set_num_threads(1)
        tokenizer, processor, model = build_untrained(seed=5, image_size=56)
        rendered = render_training_set(processor, 8, seed=5, progress=False)
        settings = TrainSettings(steps=3, batch_size=4, warmup_steps=1, seed=5)
        train_model(
            model,
            rendered.examples,
            rendered.images,
            settings,
            tokenizer.pad_token_id,
            processor.image_token_id,
            log_path="/dev/null",
            progress=False,
        )
        return {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}

    threads = torch.get_num_threads()
    try:
        first, second = three_steps(), three_steps()
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(first[name], second[name]) for name in first)


def test_training_and_held_out_seeds_are_disjoint():
    train_seeds = {seed for _, seed in training_sources(2000, seed=0)}
    held_out = {record["seed"] for _, record in held_out_samples(3)}
    assert train_seeds.isdisjoint(held_out)


def test_a_subset_of_held_out_sources_is_a_slice_of_the_full_evaluation():
    """The arithmetic samples asked alone are the ones the full evaluation (the model card) asks."""
    full = [record for _, record in held_out_samples(2) if record["source"] in ("arithmetic", "shape")]
    alone = [record for _, record in held_out_samples(2, ["shape", "arithmetic"])]
    key = {r["seed"]: r["question"] for r in full}
    assert {r["seed"]: r["question"] for r in alone} == key and len(key) == 4
    with pytest.raises(UserInputError, match="unknown held-out source"):
        held_out_samples(1, ["counting/dots"])


def test_held_out_seeds_of_the_cards_sources_stay_put_and_subset_counting_has_distractors():
    """A source's held-out seeds follow its place in source_makers: the sources the shipped cards
    measured keep their places (a new source goes last), so their numbers stay comparable."""
    assert list(source_makers(vary=False)) == [
        "counting/syndot", "counting/dot_variants", "counting/synpoly", "counting/synreal", "colour", "shape",
        "spatial", "arithmetic", "existence", "foreign/counting", "foreign/colour", "foreign/shape",
        "counting/subset", "counting/groups", "foreign/existence", "foreign/spatial"]
    samples = held_out_samples(20, ["counting/subset"])
    assert [int(r["answer"]) for _, r in samples] == [1 + i % 10 for i in range(20)]  # counts cycle 1..10
    for _, record in samples:
        assert record["distractors"] >= 1 and len(record["objects"]) == int(record["answer"]) + record["distractors"]
        assert record["template"] in ("How many {color} objects are there?", "How many {shape_plural} are there?")
    assert parse_mix("counting/subset=0.2,arithmetic=0.1") == {"counting/subset": 0.2, "arithmetic": 0.1}


def test_group_counting_asks_beside_one_other_group_that_often_outnumbers_it():
    samples = held_out_samples(40, ["counting/groups"])
    assert [int(r["answer"]) for _, r in samples] == [1 + i % 10 for i in range(40)]
    larger = 0
    for _, record in samples:
        key = "color" if "{color}" in record["template"] else "shape"
        others = [o[key] for o in record["objects"] if o["id"] not in record["targets"]]
        assert len(set(others)) == 1 and len(others) == record["distractors"] >= 1
        larger += len(others) > int(record["answer"])
    assert 8 <= larger <= 32  # the other group outnumbers the asked one on a good share of images
    assert parse_mix("counting/groups=0.15") == {"counting/groups": 0.15}


def test_learning_rate_warms_up_then_decays():
    settings = TrainSettings(steps=100, learning_rate=1.0, warmup_steps=10)
    rates = [rate_at(settings, step) for step in range(100)]
    assert rates[0] == pytest.approx(0.1) and rates[9] == pytest.approx(1.0)
    assert all(a >= b for a, b in zip(rates[9:], rates[10:], strict=False)) and rates[-1] >= 0.05


def test_a_second_stage_continues_the_folder_and_the_card_lists_both(smoke_run, tmp_path):
    first, _ = smoke_run
    options = "--seed 4 --steps 2 --batch-size 2 --examples 8 --warmup 1 --held-out 1 --threads 1 --quiet"
    options += " --probe-scenes 6"
    argv = ["zoo", "train", "--out", str(tmp_path), *options.split(), "--init-from", str(first)]
    argv += ["--mix", "colour=1,shape=1", "--max-objects", "2", "--grow-vision-depth", "5", "--grow-text-layers", "6"]
    threads = torch.get_num_threads()
    try:
        assert main(argv) == 0
    finally:
        torch.set_num_threads(threads)
    card = (tmp_path / "MODEL_CARD.md").read_text()
    assert "stage 1 (from scratch): seed 3, 20 steps" in card
    assert "stage 2 (continuing stage 1): seed 4, 2 steps" in card
    assert "--init-from stage1" in card and "--mix colour=0.5,shape=0.5 --max-objects 2" in card
    assert "curriculum: non-counting tasks with at most 2 objects" in card
    assert "--max-objects 2 --grow-vision-depth 5 --grow-text-layers 6 --init-from stage1" in card
    assert "vision tower first grown to 5 blocks" in card and "vision tower: depth 5" in card
    assert "decoder first grown to 6 layers" in card and "language model: 6 layers" in card
    config = Qwen2_5_VLForConditionalGeneration.from_pretrained(tmp_path).config
    assert config.vision_config.depth == 5 and config.text_config.num_hidden_layers == 6


@pytest.mark.parametrize("max_objects", [1, 2, 3])
def test_curriculum_caps_objects_of_non_counting_tasks_only(max_objects):
    makers = source_makers(vary=True, max_objects=max_objects)
    for task, floor in (("colour", 1), ("shape", 1), ("existence", 1), ("spatial", 2), ("arithmetic", 3)):
        sizes = {len(makers[task](seed)[1]["objects"]) for seed in range(40)}
        assert max(sizes) == max(max_objects, floor), (task, sizes)
    counts = {makers["counting/synpoly"](seed)[1]["count"] for seed in range(60)}
    assert max(counts) > 5  # counting keeps its 1..10 answers
    with pytest.raises(ValueError, match="max_objects must be a positive integer"):
        source_makers(vary=True, max_objects=0)


def test_a_stage_can_change_the_image_size(smoke_run, tmp_path):
    first, _ = smoke_run
    options = "--seed 4 --steps 2 --batch-size 2 --examples 4 --warmup 1 --held-out 1 --threads 1 --quiet"
    options += " --probe-scenes 6"
    argv = ["zoo", "train", "--out", str(tmp_path), *options.split(), "--init-from", str(first)]
    threads = torch.get_num_threads()
    try:
        assert main([*argv, "--image-size", "224"]) == 0
        with pytest.raises(SystemExit) as exit_info:
            main([*argv, "--image-size", "200"])
        assert exit_info.value.code == 2
    finally:
        torch.set_num_threads(threads)
    card = (tmp_path / "MODEL_CARD.md").read_text()
    assert "resized to 224 px" in card and "8x8 = 64 image tokens" in card
    assert "images at 224 px" in card and "--image-size 224 --init-from stage1" in card
    from vlens.zoo.processor import image_size_of, load_processor

    processor = load_processor(tmp_path)
    assert image_size_of(processor) == 224
    out = processor(images=[Image.new("RGB", (50, 50))], text=["<|vision_start|><|image_pad|><|vision_end|>"])
    assert out["input_ids"][0].count(processor.image_token_id) == 64


def test_mix_parsing_and_weights():
    assert parse_mix("colour=2, shape=1") == {"colour": 2.0, "shape": 1.0}
    with pytest.raises(ValueError, match="bad entry"):
        parse_mix("zebras=1")
    picks = [name for name, _ in training_sources(400, seed=0, mix={"colour": 3.0, "shape": 1.0})]
    assert set(picks) == {"colour", "shape"} and picks.count("colour") > 2 * picks.count("shape")


def test_stop_after_and_finalizing_a_checkpoint(tmp_path):
    options = "--seed 6 --steps 12 --stop-after 8 --checkpoint-every 4 --batch-size 2 --examples 8 --warmup 2"
    options += " --image-size 56 --probe-scenes 6"
    argv = [
        "zoo",
        "train",
        "--out",
        str(tmp_path),
        *options.split(),
        "--held-out",
        "1",
        "--threads",
        "1",
        "--quiet",
    ]
    threads = torch.get_num_threads()
    try:
        assert main(argv) == 0
        # pretend the folder was a checkpoint taken at step 4: cut back and re-evaluate it
        summary = json.loads((tmp_path / "evaluation.json").read_text())
        assert summary["training"]["steps"] == 8 and summary["training"]["schedule_steps"] == 12
        summary["training"]["steps"] = 4
        (tmp_path / "evaluation.json").write_text(json.dumps(summary))
        study = "<!-- vlens:interventions-study -->\n## A study\n<!-- /vlens:interventions-study -->"
        card_path = tmp_path / "MODEL_CARD.md"
        card_path.write_text(card_path.read_text() + "\n" + study + "\n")
        assert main(["zoo", "evaluate", "--model", str(tmp_path), "--write", "--held-out", "1"]) == 0
    finally:
        torch.set_num_threads(threads)
    card = card_path.read_text()
    assert "4 steps (of a 12-step schedule)" in card and "--steps 12 " in card and "--stop-after 4" in card
    assert card.count(study) == 1  # the section another command added survives the re-render
    records = [json.loads(line) for line in (tmp_path / "training_log.jsonl").read_text().splitlines()]
    assert max(record.get("step", 0) for record in records) == 4
    # one final event, last, with the new evaluation's numbers
    assert [record.get("event") for record in records].count("final") == 1 and records[-1]["event"] == "final"
    evaluation = json.loads((tmp_path / "evaluation.json").read_text())["evaluation"]["per_task"]
    assert {name: records[-1][name] for name in evaluation} == {name: row["accuracy"] for name, row in evaluation.items()}


def test_the_selection_split_draws_other_held_out_images_from_its_own_seed_range():
    from vlens.recipes.embedded.probe import PROBE_SEED_BASE
    from vlens.recipes.embedded.training_set import HELD_OUT_SPLITS, TRAIN_SEED_BASE

    card = held_out_samples(3, ["colour", "foreign/spatial"])
    selection = held_out_samples(3, ["colour", "foreign/spatial"], split="selection")
    assert [r["source"] for _, r in selection] == [r["source"] for _, r in card]
    assert all(a["seed"] != b["seed"] for (_, a), (_, b) in zip(card, selection, strict=True))
    assert held_out_samples(3, ["colour"], split="selection") == selection[:3]  # a slice, as for the card
    # both ranges hold every source's 1,000,000 seeds, clear of each other, of training and of the probes
    n_sources = len(source_makers(vary=False))
    card_base, selection_base = HELD_OUT_SPLITS["card"], HELD_OUT_SPLITS["selection"]
    assert card_base + 1_000_000 * n_sources <= selection_base
    assert selection_base + 1_000_000 * n_sources <= PROBE_SEED_BASE
    assert TRAIN_SEED_BASE * (898 + 1) + 1_000_000 <= card_base  # recipe seeds up to 898 train below both
    with pytest.raises(UserInputError, match="unknown held-out split 'test'"):
        held_out_samples(1, ["colour"], split="test")
    with pytest.raises(UserInputError, match="between 0 and 999,999"):
        held_out_samples(1_000_000, ["colour"])

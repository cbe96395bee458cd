"""`zoo train --question-first P` and `zoo evaluate --question-first`: the question before the image in
the user turn (issue 40: with it after the image, image tokens can never attend to it)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from PIL import Image

from tests.helpers.faults import run_cli
from vlens.recipes.embedded.batches import IGNORE_INDEX, collate, encode_example, to_model_image
from vlens.recipes.embedded.recipe import check_settings, fingerprint
from vlens.recipes.embedded.settings import RecipeSettings
from vlens.recipes.embedded.tokenizer import build_tokenizer
from vlens.recipes.embedded.training_set import asks_question_first, render_training_set, training_sources
from vlens.recipes.embedded.vocabulary import vocabulary_words
from vlens.utils.errors import UserInputError
from vlens.zoo.processor import assemble_processor, build_image_processor

SIZE = 84  # 3 x 3 merged image tokens: unlike the recipe's 168 / 224 px
MIX = {"existence": 1.0, "colour": 1.0, "counting/syndot": 1.0}  # binding tasks (partners) and one without


@pytest.fixture(scope="module")
def processor():
    return assemble_processor(build_tokenizer(vocabulary_words()), build_image_processor(SIZE))


def _prompt_ids(example) -> list[int]:
    return [token for token, label in zip(example.input_ids, example.labels, strict=True) if label == IGNORE_INDEX]


def _question_first(ids: list[int], image_token_id: int) -> bool:
    """Whether the user turn's text comes before its image (<|im_start|> user \\n, then either)."""
    return ids.index(image_token_id) > 5  # image first: <|vision_start|> is the 4th token, the pads next


@pytest.mark.parametrize("question_first", [True, False])
def test_an_example_is_the_processors_own_encoding_of_its_content_order(processor, question_first):
    """Token for token (image tokens expanded by the processor, 9 at 84 px), with the answer and
    <|im_end|> supervised; the batch's token types are the processor's too."""
    question, answer = "What colour is the star?", "red"
    image = Image.fromarray(np.random.default_rng(0).integers(0, 256, (120, 120, 3), dtype=np.uint8))
    text, slot = {"type": "text", "text": question}, {"type": "image"}
    content = [text, slot] if question_first else [slot, text]
    prompt = processor.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True)
    reference = processor(images=[image], text=[prompt + answer + "<|im_end|>"], return_tensors="pt")

    example = encode_example(processor, question, answer, 0, question_first=question_first)
    assert example.input_ids == reference["input_ids"][0].tolist()
    assert example.input_ids.count(processor.image_token_id) == (SIZE // 28) ** 2
    assert _question_first(example.input_ids, processor.image_token_id) is question_first
    supervised = [label for label in example.labels if label != IGNORE_INDEX]
    assert processor.tokenizer.decode(supervised[:-1]) == answer
    assert supervised[-1] == processor.tokenizer.eos_token_id
    batch = collate([example], torch.from_numpy(to_model_image(image, SIZE)[None]), 0, processor.image_token_id)
    assert torch.equal(batch["mm_token_type_ids"], reference["mm_token_type_ids"])
    assert torch.equal(batch["pixel_values"], reference["pixel_values"])
    if not question_first:  # the default is today's order
        assert encode_example(processor, question, answer, 0).input_ids == example.input_ids


def _image_first_order(ids: list[int], image_token_id: int, vision_end: int) -> list[int]:
    """A question-first prompt's ids with the image block moved back in front of the question."""
    start, end = ids.index(image_token_id) - 1, ids.index(vision_end) + 1  # <|vision_start|> .. <|vision_end|>
    return ids[:3] + ids[start:end] + ids[3:start] + ids[end:]


def test_p0_is_image_first_p1_question_first_and_otherwise_only_the_order_differs(processor):
    image_first = render_training_set(processor, 24, seed=3, progress=False, mix=MIX, minimal_pairs=True)
    default = render_training_set(processor, 24, seed=3, progress=False, mix=MIX, minimal_pairs=True,
                                  question_first=0.0)
    question_first = render_training_set(processor, 24, seed=3, progress=False, mix=MIX, minimal_pairs=True,
                                         question_first=1.0)
    image_token = processor.image_token_id
    vision_end = processor.tokenizer.convert_tokens_to_ids("<|vision_end|>")
    assert image_first.partners is not None and any(p is not None for p in image_first.partners)
    assert question_first.partners == image_first.partners == default.partners
    assert question_first.sources == image_first.sources
    assert torch.equal(question_first.images[list(range(24))], image_first.images[list(range(24))])
    for old, zero, new in zip(image_first.examples, default.examples, question_first.examples, strict=True):
        assert zero == old and not _question_first(old.input_ids, image_token)
        assert _question_first(new.input_ids, image_token)
        assert _image_first_order(new.input_ids, image_token, vision_end) == old.input_ids
        assert new.labels[-3:] == old.labels[-3:] and new.image_index == old.image_index


def test_a_fraction_is_drawn_per_sample_seed_and_partners_keep_the_order(processor):
    seeds = range(10_000, 14_000)
    for p in (0.1, 0.3, 0.5):
        drawn = [asks_question_first(seed, p) for seed in seeds]
        assert drawn == [asks_question_first(seed, p) for seed in seeds]  # deterministic
        assert abs(np.mean(drawn) - p) < 0.03  # binomial sd <= 0.008 at n = 4000
    assert not any(asks_question_first(seed, 0.0) for seed in seeds)
    assert all(asks_question_first(seed, 1.0) for seed in seeds)

    rendered = render_training_set(processor, 30, seed=4, progress=False, mix=MIX, minimal_pairs=True,
                                   question_first=0.5)
    again = render_training_set(processor, 30, seed=4, progress=False, mix=MIX, minimal_pairs=True,
                                question_first=0.5)
    assert rendered.examples == again.examples
    sample_seeds = [seed for _, seed in training_sources(30, 4, MIX)]
    orders = [_question_first(e.input_ids, processor.image_token_id) for e in rendered.examples]
    assert orders == [asks_question_first(sample_seeds[e.image_index], 0.5) for e in rendered.examples]
    assert 0 < sum(orders) < len(orders)
    assert rendered.partners is not None
    pairs = [(row, partner) for row, partner in enumerate(rendered.partners) if partner is not None]
    assert pairs and all(orders[row] == orders[partner] for row, partner in pairs)


def test_bad_probabilities_are_refused(processor, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for bad in ("-0.1", "1.5", "nan", "inf", "half"):
        code, err = run_cli(["zoo", "train", "--out", "o", "--question-first", bad], capsys)
        assert code == 2 and "argument --question-first: must be" in err and "Traceback" not in err, err
    assert not (tmp_path / "o").exists()
    for bad in (-0.1, 1.5, math.nan):
        with pytest.raises(UserInputError, match="question.first"):
            check_settings(RecipeSettings(question_first=bad))
        with pytest.raises(UserInputError, match="question_first"):
            render_training_set(processor, 2, seed=0, progress=False, question_first=bad)
    with pytest.raises(UserInputError, match="language stage"):
        check_settings(RecipeSettings(stage="vision", question_first=0.5))


def test_the_order_keys_the_run_and_old_states_still_resume():
    """The fingerprint keys the saved state and the rendered-set cache: another P is another run;
    P = 0 leaves the key out, so a state saved before the option resumes."""
    before = fingerprint(RecipeSettings())
    assert "question_first" not in before and "minimal_pairs" in before
    half, whole = fingerprint(RecipeSettings(question_first=0.5)), fingerprint(RecipeSettings(question_first=1.0))
    assert half["question_first"] == 0.5 and whole["question_first"] == 1.0
    assert {k: v for k, v in half.items() if k != "question_first"} == before


def _tiny_model_folder(folder):
    from vlens.recipes.embedded.recipe import build_untrained, save_model_folder

    _, processor, model = build_untrained(seed=2, image_size=56, text_layers=1)
    save_model_folder(model, processor, folder)
    return model.eval(), processor


def test_evaluate_asks_in_the_order_it_is_told(tmp_path):
    """The prompts `evaluate_samples` generates from are the training encoding of that order."""
    from vlens.recipes.embedded.evaluate import evaluate_samples
    from vlens.recipes.embedded.training_set import held_out_samples

    model, processor = _tiny_model_folder(tmp_path / "m")
    samples = held_out_samples(1, ["colour", "existence"])
    seen: list[torch.Tensor] = []
    generate = model.generate

    def spy(**batch):
        seen.append(batch["input_ids"][batch["attention_mask"].bool()])  # a row each: no padding here
        return generate(**batch)

    model.generate = spy
    for question_first in (True, False):
        seen.clear()
        report = evaluate_samples(model, processor, samples, batch_size=1, question_first=question_first)
        assert set(report["per_task"]) == {"colour", "existence"}
        for ids, (_, record) in zip(seen, samples, strict=True):
            expected = encode_example(processor, record["question"], "yes", 0, question_first=question_first)
            assert ids.tolist() == _prompt_ids(expected)


def test_zoo_evaluate_question_first_and_the_selection_split(tmp_path, capsys):
    from vlens.cli import main

    _tiny_model_folder(tmp_path / "m")
    argv = ["zoo", "evaluate", "--model", str(tmp_path / "m"), "--held-out", "1", "--quiet"]
    assert main([*argv, "--question-first"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["per_task"]["colour"]["n"] == 1
    code, err = run_cli([*argv, "--question-first", "--write"], capsys)
    assert code == 2 and "--write records the image-first evaluation" in err
    # the selection split: other images, the same report; never written into the card
    assert main([*argv, "--split", "selection"]) == 0
    assert json.loads(capsys.readouterr().out)["per_task"]["colour"]["n"] == 1
    code, err = run_cli([*argv, "--split", "selection", "--write"], capsys)
    assert code == 2 and "run --split selection without --write" in err


def test_a_question_first_stage_records_p_and_a_resume_with_another_p_is_refused(tmp_path, capsys):
    """A 2-step stage from scratch at 56 px stopped after step 1: its saved state and rendered set
    belong to P = 1, so resuming at P = 0.5 is refused (orders never mix); resumed at P = 1 it
    finishes, and its record and card say P."""
    from vlens.cli import main

    out = tmp_path / "qf"
    argv = ["zoo", "train", "--out", str(out), "--seed", "2", "--image-size", "56", "--examples", "6",
            "--batch-size", "4", "--steps", "2", "--warmup", "1", "--held-out", "1", "--probe-scenes", "6",
            "--checkpoint-every", "1", "--log-every", "1", "--threads", "1", "--quiet", "--text-layers", "1",
            "--mix", "existence=1,colour=1", "--minimal-pairs", "--question-first", "1"]
    assert main([*argv, "--stop-after", "1"]) == 0
    assert (tmp_path / "qf.checkpoint" / "rendered.pt").is_file()
    changed = [*argv[:-1], "0.5", "--resume", "--overwrite"]
    code, err = run_cli(changed, capsys)
    assert code == 2 and "differing: question_first" in err, err
    assert main([*argv, "--resume", "--overwrite"]) == 0
    summary = json.loads((out / "evaluation.json").read_text())
    assert summary["training"]["question_first"] == 1.0 and summary["training"]["steps"] == 2
    card = (out / "MODEL_CARD.md").read_text()
    assert "question before the image with probability 1 per sample" in card
    assert " --minimal-pairs --question-first 1 " in card


def test_arithmetic_samples_get_partners_only_with_arithmetic_pairs(processor):
    from vlens.recipes.embedded.training_set import PairOptions

    mix = {"arithmetic": 1.0}
    plain = render_training_set(processor, 6, seed=2, progress=False, mix=mix, minimal_pairs=True)
    assert len(plain.examples) == 6 and all(p is None for p in plain.partners)
    paired = render_training_set(processor, 6, seed=2, progress=False, mix=mix,
                                 minimal_pairs=PairOptions(binding=True, arithmetic=True))
    assert len(paired.examples) == 12  # every arithmetic sample has a partner: the other operation
    assert all(paired.partners[paired.partners[i]] == i for i in range(12))
    with pytest.raises(UserInputError, match="set binding=True too"):
        PairOptions(arithmetic=True)

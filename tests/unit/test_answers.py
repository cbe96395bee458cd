"""The one answer rule (vlens.core.answers) and readable labels, on the real Qwen vocabulary."""

from __future__ import annotations

import pytest
import torch

from tests.helpers.models import tiny_vlm
from tests.helpers.real_vocab import hand_logits, real_model
from vlens import SweepOptions
from vlens.core.answers import answer_ids, answer_logprobs, contrast, single_token, teacher_force
from vlens.evaluation import EvalSettings
from vlens.testing import tiny_qwen_processor


@pytest.fixture(scope="module")
def model():
    return real_model()


def test_fixture_has_real_ids_and_digit_tokens(model):
    tok = model.tokenizer
    assert tok.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>",
                                      "<|vision_end|>", "<|image_pad|>"]) == [151643, 151644, 151645, 151652,
                                                                               151653, 151655]
    assert model.cfg.d_vocab == 152064
    # Qwen's digits: one token per digit ("0" is 15 .. "9" is 24)
    for count in range(1, 21):
        assert answer_ids(model, str(count)) == [15 + int(d) for d in str(count)]


def test_labels_decode_like_transformer_lens(model):
    assert model.to_str_tokens("How many dots?\n12") == ["How", " many", " dots", "?\n", "1", "2"]
    assert model.to_str_tokens(16) == ["1"]
    assert model.to_str_tokens([16, 17]) == ["1", "2"]
    assert model.to_str_tokens(torch.tensor([198, 1657])) == ["\n", " many"]
    assert model.to_str_tokens(torch.tensor([[16], [17]])) == [["1"], ["2"]]


def test_contrast_rule():
    m = real_model()
    c = contrast(m, "9", "10")
    assert (c.prefix, c.clean_id, c.corrupt_id) == ([], 24, 16)
    c = contrast(m, "12", "13")
    assert (c.prefix, c.clean_id, c.corrupt_id, c.clean_ids, c.corrupt_ids) == ([16], 17, 18, [16, 17], [16, 18])
    c = contrast(m, "1", "12")  # a prefix answer is closed by the end-of-turn token
    assert (c.prefix, c.clean_id, c.corrupt_id) == ([16], 151645, 17)
    with pytest.raises(ValueError, match="no differing token"):
        contrast(m, "7", "7")
    with pytest.raises(ValueError, match="needs single-token answers.*'12'.*2 tokens.*16, 17"):
        single_token(m, "12", "this method", example="ex-3")


def test_unknown_answer_is_an_error_naming_the_example():
    processor = tiny_qwen_processor()  # word-level: no "37"
    with pytest.raises(ValueError, match="example 'row-5'.*'37'.*not in the model's vocabulary.*UNK"):
        answer_ids(processor.tokenizer, "37", example="row-5")


def test_teacher_forced_logprob_equals_hand_computation(model):
    inputs = model.prepare(prompts=["How many dots are there?", "How many?"])
    answers = [answer_ids(model, "12"), answer_ids(model, "7")]
    forced = teacher_force(model, inputs, answers)
    logprob, exact = answer_logprobs(model(forced), answers)
    for row, ids in enumerate(answers):
        prompt = inputs.input_ids[row][inputs.attention_mask[row].bool()].tolist()
        logits = hand_logits(model, prompt + ids[:-1]).log_softmax(-1)
        expected = sum(float(logits[len(prompt) - 1 + j, t]) for j, t in enumerate(ids))
        assert float(logprob[row]) == pytest.approx(expected, abs=1e-4)
        greedy = all(int(logits[len(prompt) - 1 + j].argmax()) == t for j, t in enumerate(ids))
        assert bool(exact[row]) == greedy


def test_eval_warns_and_skips_scoring_an_inexpressible_target(tmp_path):
    from vlens.evaluation import EvalDataset, EvalExample, HookedVLMBackend, evaluate
    from vlens.testing import random_image

    model = tiny_vlm("qwen2_5_vl", n_layers=1)
    path = tmp_path / "a.png"
    random_image(56, 56).save(path)
    dataset = EvalDataset(format="imagefolder", source="t", examples=[
        EvalExample(id="three", images=[str(path)], question="How many dots are there?", target=3),
        EvalExample(id="thirty-seven", images=[str(path)], question="How many dots are there?", target=37)])
    with pytest.warns(UserWarning, match="example 'thirty-seven'.*'37'.*not in the model's vocabulary"):
        result = evaluate(HookedVLMBackend(model), dataset, EvalSettings(max_new_tokens=2, post_prompt=""),
                          options=SweepOptions(progress=False))
    three, other = result.predictions
    assert three.target_tokens == answer_ids(model, "3") and three.target_logprob is not None
    assert other.target_tokens is None and other.target_logprob is None

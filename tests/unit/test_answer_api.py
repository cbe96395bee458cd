"""Answers of several tokens in user code: `prepare(..., answers=...)` and `model.answer_logit_diff`.

On the real-vocabulary fixture (Qwen's byte-level BPE: "12" is "1", "2"), against log-probabilities
summed by hand over a sequence built here from the prompt's ids and the answer's tokens.
"""

from __future__ import annotations

import functools

import pytest
import torch

from vlens.testing import random_image
from vlens.testing.real_vocab import real_vocab_model
from vlens.utils.errors import UserInputError

PROMPT = "How many dots are there?"


@functools.lru_cache(maxsize=1)
def _model():
    return real_vocab_model(min_pixels=56 * 56, max_pixels=56 * 56)


def _inputs(model, n: int = 1, answers=None):
    images = [random_image(56, 56, seed) for seed in range(n)]
    return model.prepare(images=images, prompts=[PROMPT] * n, answers=answers)


def _digits(model, text: str) -> list[int]:
    return [model.to_single_token(ch) for ch in text]  # Qwen splits numbers digit by digit


def _logprob_by_hand(model, inputs, row: int, answer: list[int]) -> float:
    """sum_j log p(a_j | prompt, a_<j) from one forward over the row's prompt followed by the answer."""
    keep = inputs.attention_mask[row].bool()
    ids = torch.cat([inputs.input_ids[row][keep], torch.tensor(answer)])[None]
    sizes = [int(grid.prod()) for grid in inputs.image_grid_thw]  # one image per row: its patches
    start = sum(sizes[:row])
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=torch.ones_like(ids),
                       pixel_values=inputs.pixel_values[start:start + sizes[row]],
                       image_grid_thw=inputs.image_grid_thw[row:row + 1])
    log_probs = logits[0].float().log_softmax(-1)
    start = int(keep.sum()) - 1  # the last prompt position predicts the answer's first token
    return float(sum(log_probs[start + j, token] for j, token in enumerate(answer)))


def test_prepare_appends_the_answer_prefix_after_the_generation_prompt():
    model = _model()
    plain = _inputs(model)
    forced = _inputs(model, answers="1")
    assert forced.input_ids[0].tolist() == plain.input_ids[0].tolist() + _digits(model, "1")
    assert model.to_str_tokens(forced.input_ids[0])[-4:] == ["<|im_start|>", "assistant", "\n", "1"]
    assert int(forced.regions.final[0]) == forced.seq_len - 1  # the last position predicts what follows "1"
    assert torch.equal(forced.regions.images[0][0], plain.regions.images[0][0])
    two = _inputs(model, 2, answers=["1", "12"])  # different lengths: still left-padded
    assert two.input_ids[1, -2:].tolist() == _digits(model, "12")
    assert two.input_ids[0, -1].item() == _digits(model, "1")[0] and two.attention_mask[:, -1].all()
    with pytest.raises(UserInputError, match="2 answers for 1 prompts"):
        _inputs(model, 1, answers=["1", "2"])


def test_answer_logit_diff_is_the_difference_of_summed_log_probs():
    model = _model()
    inputs = _inputs(model)
    diff = model.answer_logit_diff(inputs, "12", "7")  # two tokens against one
    by_hand = _logprob_by_hand(model, inputs, 0, _digits(model, "12")) - _logprob_by_hand(model, inputs, 0,
                                                                                           _digits(model, "7"))
    assert diff.shape == (1,)
    assert diff.item() == pytest.approx(by_hand, abs=1e-4)


def test_first_token_mode_reads_the_first_differing_token_after_the_shared_prefix():
    model = _model()
    inputs = _inputs(model)
    logits = model(_inputs(model, answers="1"))[0, -1]
    two, three = _digits(model, "23")
    expected = (logits[two] - logits[three]).item()
    assert model.answer_logit_diff(inputs, "12", "13", mode="first_token").item() == pytest.approx(expected, abs=1e-5)
    # with the shared "1" forced, the whole-answer log-probs differ by the same logit difference
    assert model.answer_logit_diff(inputs, "12", "13").item() == pytest.approx(expected, abs=1e-4)
    # "1" against "12": the shorter answer is closed by the end-of-turn token
    end = model.tokenizer.eos_token_id
    assert model.answer_logit_diff(inputs, "1", "12", mode="first_token").item() == pytest.approx(
        (logits[end] - logits[two]).item(), abs=1e-5)


def test_one_token_answers_give_the_logit_difference_and_rows_are_independent():
    model = _model()
    inputs = _inputs(model, 2)
    logits = model(inputs)[:, -1]
    three, five = model.to_single_token("3"), model.to_single_token("5")
    diff = model.answer_logit_diff(inputs, "3", "5")
    torch.testing.assert_close(diff, (logits[:, three] - logits[:, five]).float(), atol=1e-4, rtol=0)
    per_row = model.answer_logit_diff(inputs, ["12", "3"], ["13", "45"])
    assert per_row[1].item() == pytest.approx(_logprob_by_hand(model, inputs, 1, [three])
                                              - _logprob_by_hand(model, inputs, 1, _digits(model, "45")), abs=1e-4)
    with pytest.raises(UserInputError, match="mode"):
        model.answer_logit_diff(inputs, "3", "5", mode="sum")  # type: ignore[arg-type]

"""Fault family "vlens train": bad settings are refused before anything runs (NaN focus weight,
--max-steps 0 / -5, --checkpoint-every 0, --limit -2), and a run resumes only with the data and
settings its checkpoint was written with, unless forced."""

from __future__ import annotations

import pytest

from tests.helpers.sft import sft_config, sft_examples, sft_model
from vlens.training.data import read_sft_folder
from vlens.training.sft import SFTConfig, train_sft
from vlens.utils.errors import UserInputError


@pytest.mark.parametrize("field, value, message", [
    ("focus_weight", float("nan"), "focus_weight"), ("max_steps", 0, "max_steps"), ("max_steps", -5, "max_steps"),
    ("checkpoint_every", 0, "checkpoint_every"), ("log_every", 0, "log_every"), ("learning_rate", float("inf"), "learning_rate"),
])
def test_bad_settings_are_refused(field, value, message):
    with pytest.raises(UserInputError, match=message):
        SFTConfig(**{field: value}).check()


def test_negative_limit_is_refused(tmp_path):
    with pytest.raises(UserInputError, match="limit must be an integer >= 1"):
        read_sft_folder(tmp_path, limit=-2)


def test_resume_refuses_other_data_or_settings(tmp_path):
    examples = sft_examples(4)
    train_sft(sft_model(), examples, sft_config(), tmp_path, stop_after=1, progress=False)
    with pytest.raises(UserInputError, match=r"learning_rate 0\.01 -> 0\.5.*--force-resume"):
        train_sft(sft_model(), examples, sft_config(learning_rate=0.5), tmp_path, progress=False)
    with pytest.raises(UserInputError, match=r"batch_size 2 -> 1"):
        train_sft(sft_model(), examples, sft_config(batch_size=1), tmp_path, progress=False)
    other = sft_examples(5)[1:]  # as many examples, other images
    with pytest.raises(UserInputError, match=r"the data \(4 -> 4 examples"):
        train_sft(sft_model(), other, sft_config(), tmp_path, progress=False)
    # harmless settings may change; forcing is explicit
    assert train_sft(sft_model(), examples, sft_config(checkpoint_every=5), tmp_path, progress=False).resumed_from == 1
    forced = train_sft(sft_model(), other, sft_config(), tmp_path / "forced", progress=False, stop_after=1)
    assert train_sft(sft_model(), examples, sft_config(), tmp_path / "forced", progress=False,
                     force_resume=True).resumed_from == 1
    assert forced.steps == 1


def test_starting_over_keeps_the_earlier_checkpoints(tmp_path):
    examples = sft_examples(4)
    train_sft(sft_model(), examples, sft_config(), tmp_path, stop_after=1, progress=False)
    with pytest.warns(UserWarning, match=r"moved to .*checkpoints\.previous-1"):
        result = train_sft(sft_model(), examples, sft_config(learning_rate=0.5), tmp_path, resume=False, progress=False,
                           stop_after=1)
    assert result.resumed_from is None
    assert (tmp_path / "checkpoints.previous-1" / "step-000001" / "state.json").is_file()


def test_an_answer_the_tokenizer_cannot_express_fails_before_the_first_step(tmp_path):
    examples = sft_examples(4)
    examples[3].answer = "37"  # the test tokenizer is word-level: "37" would be <unk>
    examples[3].meta.update(id="row-4", source="metadata.jsonl line 4")
    # one step of batch 2 never reaches example 4: the check must not wait for its batch
    with pytest.raises(UserInputError, match=r"example 'row-4 \(metadata\.jsonl line 4\)'.*'37'.*not in the model's vocabulary"):
        train_sft(sft_model(), examples, sft_config(max_steps=1), tmp_path, progress=False)
    assert not (tmp_path / "checkpoints").exists()

"""A family registered only to say why it is refused (Perception LM: timm needs torchvision) stops before any
weight is read, with the reason, and is not listed as convertible."""

from __future__ import annotations

import pytest

import vlens
from vlens.core.architectures.perception_lm import REFUSAL
from vlens.utils.errors import UserInputError


def test_perception_lm_is_refused_with_the_reason():
    adapter = vlens.adapter_for("PerceptionLMForConditionalGeneration")
    assert adapter.family == "perception_lm" and adapter.refusal == REFUSAL
    with pytest.raises(UserInputError, match="timm requires torchvision"):
        adapter.hf_model_class("PerceptionLMForConditionalGeneration")  # what loading a checkpoint calls first
    with pytest.raises(UserInputError, match="timm requires torchvision"):
        adapter.build_config(object())
    assert "PerceptionLMForConditionalGeneration" not in vlens.supported_architectures()
    assert "Gemma4ForConditionalGeneration" in vlens.supported_architectures()


def test_vlens_info_marks_the_refused_family(capsys):
    from vlens.cli import main

    assert main(["info", "--families", "--model", "no-such-model"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("  perception_lm:"))
    assert "refused: " in line and "torchvision" in line

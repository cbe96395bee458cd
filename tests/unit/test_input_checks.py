"""Hand-edited inputs and out-of-range choices are one clear `UserInputError`, before any layer runs:
`forward()` on `VLMInputs` with a wrong shape, dtype, vocabulary id, pixel rows or a prompt longer
than the model's context; `fit_temperature` with a head outside the importance grid."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from PIL import Image

from vlens.core.model import HookedVLM
from vlens.interventions.temperature import fit_temperature
from vlens.testing import tiny_hf_model, tiny_qwen_processor
from vlens.utils.errors import UserInputError


@pytest.fixture(scope="module")
def model():
    return HookedVLM.from_hf(tiny_hf_model("qwen2_5_vl"), processor=tiny_qwen_processor())


@pytest.fixture(scope="module")
def inputs(model):
    return model.prepare(images=[Image.new("RGB", (56, 56), "red")], prompts=["how many red dots"])


def _edits(model, inputs):
    ids, mask = inputs.input_ids, inputs.attention_mask
    too_long = torch.cat([ids, ids[:, -1:].repeat(1, model.cfg.n_ctx)], 1)
    return {
        "float ids": ({"input_ids": ids.float()}, "input_ids must hold integer token ids, got dtype torch.float32"),
        "3-D ids": ({"input_ids": ids[None]}, r"input_ids must be a \[batch, pos\] tensor, got \(1, 1, "),
        "unknown id": ({"input_ids": ids.masked_fill(ids == ids[0, -1], 10**6)},
                       f"outside the vocabulary \\[0, {model.cfg.d_vocab}\\)"),
        "short mask": ({"attention_mask": mask[:, :-1]}, "attention_mask must have input_ids' shape"),
        "mask values": ({"attention_mask": mask * 2}, r"attention_mask must hold only 0 \(padding\) and 1"),
        "integer pixels": ({"pixel_values": inputs.pixel_values.long()}, "pixel_values must be a floating-point"),
        "missing pixel rows": ({"pixel_values": inputs.pixel_values[:-4]}, "needs 16 rows of patches"),
        "too long": ({"input_ids": too_long, "attention_mask": torch.ones_like(too_long), "regions": None},
                     f"tokens long, longer than the model's context of {model.cfg.n_ctx} positions"),
    }


@pytest.mark.parametrize("edit", ["float ids", "3-D ids", "unknown id", "short mask", "mask values", "integer pixels",
                                  "missing pixel rows", "too long"])
def test_a_hand_edited_input_is_one_clear_error(model, inputs, edit):
    changes, message = _edits(model, inputs)[edit]
    with torch.no_grad():
        model(inputs)  # the unedited inputs run
        with pytest.raises(UserInputError, match=message):
            model(dataclasses.replace(inputs, **changes))


def test_a_prompt_longer_than_the_context_fails_before_any_layer_runs(model, inputs):
    changes, _ = _edits(model, inputs)["too long"]
    reached = []
    with model.hooks(fwd_hooks=[("hook_embed", lambda x, hook: reached.append(hook.name))]):
        with pytest.raises(UserInputError, match="longer than the model's context"):
            model(dataclasses.replace(inputs, **changes))
    assert reached == []


def test_a_head_outside_the_importance_grid_is_named():
    importance = torch.ones(2, 3)
    for heads, named in (([(99, 0)], "L99H0"), ([(1, 3), (0, 0)], "L1H3"), ([(-1, 0)], "L-1H0")):
        with pytest.raises(UserInputError, match=f"heads {named} do not exist: the importance covers 2 layers x 3 "
                                                 r"heads \(L0H0 .. L1H2\)"):
            fit_temperature(importance, heads=heads)
    assert fit_temperature(importance, heads=[(1, 2)]).betas == {(1, 2): pytest.approx(1.2)}

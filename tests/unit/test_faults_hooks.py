"""Fault family "hooks returning a wrong shape or dtype": the result is refused, naming the hook,
instead of being broadcast or promoted; None and in-place edits keep working."""

from __future__ import annotations

import pytest
import torch
from PIL import Image

from vlens.core.hooks import HookResultError


@pytest.fixture
def model_and_inputs(qwen_pair):
    _, model = qwen_pair("qwen2_5_vl")
    inputs = model.prepare(images=[Image.new("RGB", (56, 56), "white")], prompts=["How many dots are there?"])
    return model, inputs


def test_wrong_shape_pattern_is_refused_naming_the_hook(model_and_inputs):
    model, inputs = model_and_inputs

    def first_head_only(pattern, hook):
        return pattern[:, :1]

    with pytest.raises(HookResultError, match=r"first_head_only.*blocks\.0\.attn\.hook_pattern.*shape \(1, 1,"):
        model.run_with_hooks(inputs, fwd_hooks=[("blocks.0.attn.hook_pattern", first_head_only)])
    assert not any(h.fwd_hooks for h in model.hook_dict.values())


def test_wrong_dtype_is_refused(model_and_inputs):
    model, inputs = model_and_inputs
    with pytest.raises(HookResultError, match=r"dtype torch\.int64"):
        model.run_with_hooks(inputs, fwd_hooks=[("blocks.1.hook_resid_pre", lambda x, hook: x.long())])
    with pytest.raises(HookResultError, match="a float"):
        model.run_with_hooks(inputs, fwd_hooks=[("blocks.1.hook_resid_pre", lambda x, hook: 0.0)])


def test_none_and_in_place_edits_still_work(model_and_inputs):
    model, inputs = model_and_inputs
    clean = model(inputs)

    def zero_in_place(x, hook):
        x.zero_()

    def read_only(x, hook):
        return None

    assert torch.equal(model.run_with_hooks(inputs, fwd_hooks=[("blocks.1.hook_resid_pre", read_only)]), clean)
    edited = model.run_with_hooks(inputs, fwd_hooks=[("blocks.1.hook_resid_pre", zero_in_place)])
    returned = model.run_with_hooks(inputs, fwd_hooks=[("blocks.1.hook_resid_pre", lambda x, hook: x * 0)])
    assert torch.equal(edited, returned) and not torch.equal(edited, clean)

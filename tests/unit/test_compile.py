"""torch.compile: hooks added with `hooks()`, `add_hook` or `run_with_hooks` act on a compiled HookedVLM
exactly as on the eager one, also when the graph was traced before the hooks existed, and stop acting
once removed. The "eager" backend keeps the test cheap: the guards that decide when a frame is retraced
(what this test is about) are dynamo's, the same whichever backend compiles the graph."""

from __future__ import annotations

import logging
import warnings

import pytest
import torch

from tests.helpers.models import tiny_vlm
from vlens.testing import random_image

HOOK = "blocks.0.hook_resid_post"
PATTERN = "blocks.1.attn.hook_pattern"  # a hook that switches attention to its explicit path


def _half(x, hook):
    return x * 0.5


@pytest.fixture
def quiet_dynamo():
    torch._logging.set_logs(dynamo=logging.ERROR)  # graph-break notices
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield
    torch._logging.set_logs()


@pytest.mark.parametrize("how", ["torch.compile", pytest.param("model.compile", marks=pytest.mark.slow)])
def test_hooks_act_on_a_compiled_model_as_on_the_eager_one(how, quiet_dynamo):
    torch.set_num_threads(1)
    model = tiny_vlm("qwen2_5_vl", fresh=True, n_layers=2)
    inputs = model.prepare(images=[random_image(56, 56, 1)], prompts=["How many dots are there?"])
    with torch.no_grad():
        plain = model(inputs)
        eager = model.run_with_hooks(inputs, fwd_hooks=[(HOOK, _half)])
        eager_pattern = model.run_with_hooks(inputs, fwd_hooks=[(PATTERN, _half)])
        _, eager_cache = model.run_with_cache(inputs)
        assert (eager - plain).abs().max() > 1e-3 and (eager_pattern - plain).abs().max() > 1e-3
        if how == "torch.compile":
            compiled = torch.compile(model, backend="eager")
        else:
            model.compile(backend="eager")
            compiled = model
        torch.testing.assert_close(compiled(inputs), plain, atol=0, rtol=0)  # traced with no hook
        with model.hooks(fwd_hooks=[(HOOK, _half)]):
            torch.testing.assert_close(compiled(inputs), eager, atol=0, rtol=0)
        torch.testing.assert_close(compiled(inputs), plain, atol=0, rtol=0)  # removed: gone from the graph too
        with model.hooks(fwd_hooks=[(PATTERN, _half)]):
            torch.testing.assert_close(compiled(inputs), eager_pattern, atol=0, rtol=0)
        model.add_hook(HOOK, _half)
        try:
            torch.testing.assert_close(compiled(inputs), eager, atol=0, rtol=0)
        finally:
            model.reset_hooks()
        torch.testing.assert_close(compiled.run_with_hooks(inputs, fwd_hooks=[(HOOK, _half)]), eager, atol=0, rtol=0)
        _, cache = compiled.run_with_cache(inputs)
        torch.testing.assert_close(compiled(inputs), plain, atol=0, rtol=0)
    assert set(cache.keys()) == set(eager_cache.keys())
    for name in eager_cache.keys():
        torch.testing.assert_close(cache[name], eager_cache[name], atol=0, rtol=0, msg=name)

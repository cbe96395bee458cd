"""nnsight over a HookedVLM: every hook point (the vision tower's included) read in one trace equals
`run_with_cache`, an edit through nnsight equals the same edit as a TransformerLens hook, and outside a
trace the model keeps its fast paths."""

from __future__ import annotations

import functools

import pytest
import torch

from tests.helpers.models import FAMILIES, tiny_vlm
from vlens.testing import random_image

nnsight = pytest.importorskip("nnsight")
torch.set_num_threads(1)

# image sizes the families' tiny processors take (16-px patches for the Qwen3-VL ones)
SIZES = {"qwen3_vl": 64, "qwen3_vl_moe": 64, "qwen3_5": 64, "qwen3_5_moe": 64, "llava_next": 64}


def _inputs(model, family: str):
    size = SIZES.get(family, 56)
    return model.prepare(images=[random_image(size, size, 1)], prompts=["How many dots are there?"])


def _envoy(wrapped, name: str):
    return functools.reduce(getattr, name.split("."), wrapped)


@pytest.fixture(scope="module", params=FAMILIES)
def family(request):
    model = tiny_vlm(request.param, fresh=True)
    inputs = _inputs(model, request.param)
    with torch.no_grad():
        _, cache = model.run_with_cache(inputs)
    return request.param, model, inputs, cache


def test_every_hook_point_is_read_in_one_trace_as_run_with_cache_reads_it(family):
    name, model, inputs, cache = family
    wrapped = nnsight.NNsight(model)
    order = list(cache.keys())  # the order the forward runs them in, as a trace must request them
    assert any(n.startswith("vision.") for n in order) and any(n.endswith("hook_pattern") for n in order)
    saved: dict = {}  # filled inside the trace (nnsight runs the block's body on its own)
    with torch.no_grad(), wrapped.trace(inputs):
        for hook in order:
            saved[hook] = _envoy(wrapped, hook).output.save()
    assert set(saved) == set(cache.keys())
    for hook in order:
        got, expected = saved[hook], cache[hook]
        assert got.shape == expected.shape, f"{name} {hook}: {tuple(got.shape)} vs {tuple(expected.shape)}"
        torch.testing.assert_close(got, expected, atol=1e-6, rtol=0, msg=f"{name} {hook}")


def test_an_nnsight_edit_of_a_vision_hook_equals_the_same_transformer_lens_hook(family):
    name, model, inputs, _ = family
    hook = "vision.blocks.0.hook_resid_post"
    wrapped = nnsight.NNsight(model)
    with torch.no_grad():
        expected = model.run_with_hooks(inputs, fwd_hooks=[(hook, lambda x, hook: x * 0.5)])
        plain = model(inputs)
        out: dict = {}
        with wrapped.trace(inputs):
            point = _envoy(wrapped, hook)
            point.output = point.output * 0.5
            out["logits"] = wrapped.output.save()
        logits = out["logits"]
    assert (expected - plain).abs().max() > 1e-5, f"{name}: halving the first vision block changes nothing"
    torch.testing.assert_close(logits, expected, atol=1e-5, rtol=0)


def test_outside_a_trace_the_wrapped_model_skips_what_nobody_reads(family):
    name, model, inputs, _ = family
    nnsight.NNsight(model)  # installs its controllers on every module, inert outside a trace
    attention = [block.attn for block in model.blocks if hasattr(block.attn, "hook_pattern")]
    assert attention and not any(attn.needs_pattern() for attn in attention), name


# ---- several invokes in one trace (nnsight's clean / corrupt patching pattern): vlens.interop.nnsight
PATCHED = ["blocks.1.attn.hook_z", "vision.blocks.0.hook_resid_post", "vision.hook_image_embeds"]


@pytest.fixture(scope="module", params=["qwen2_5_vl", "llava"])  # flattened patches; one entry per image
def pair(request):
    from vlens.interop.nnsight import VLMNNsight

    model = tiny_vlm(request.param, fresh=True)
    size = SIZES.get(request.param, 56)
    clean, corrupt = (model.prepare(images=[random_image(size, size, seed)], prompts=["How many dots are there?"])
                      for seed in (1, 2))
    return request.param, model, VLMNNsight(model), clean, corrupt


@pytest.mark.parametrize("hook", PATCHED)
def test_two_invokes_patch_corrupt_into_clean_as_run_with_hooks_does(pair, hook):
    name, model, wrapped, clean, corrupt = pair
    with torch.no_grad():
        _, cache = model.run_with_cache(corrupt, names_filter=hook)
        expected = model.run_with_hooks(clean, fwd_hooks=[(hook, lambda x, hook: cache[hook.name].clone())])
        plain_clean, plain_corrupt = model(clean), model(corrupt)
        out: dict = {}
        with wrapped.trace() as tracer:
            barrier = tracer.barrier(2)  # nnsight's hand-over between invokes: the corrupt value exists below it
            with tracer.invoke(corrupt):
                point = _envoy(wrapped, hook)
                value = point.output.save()
                barrier()
                out["corrupt"] = wrapped.output.save()
            with tracer.invoke(clean):
                point = _envoy(wrapped, hook)
                barrier()
                point.output = value
                out["clean"] = wrapped.output.save()
    assert (expected - plain_clean).abs().max() > 1e-4, f"{name} {hook}: the patch changes nothing"
    torch.testing.assert_close(value, cache[hook], atol=1e-5, rtol=0)  # the invoke's own part only
    torch.testing.assert_close(out["corrupt"], plain_corrupt, atol=1e-5, rtol=0)
    torch.testing.assert_close(out["clean"], expected, atol=1e-5, rtol=0)


def test_invokes_of_different_lengths_are_refused_with_what_to_do(pair):
    from vlens.utils.errors import UserInputError

    _, model, wrapped, clean, _ = pair
    longer = model.prepare(images=[random_image(56, 56, 3)], prompts=["How many red dots are there in it?"])
    assume = longer.seq_len != clean.seq_len
    assert assume
    with pytest.raises(UserInputError, match="equally long"), torch.no_grad():
        with wrapped.trace() as tracer:
            with tracer.invoke(clean):
                wrapped.output.save()
            with tracer.invoke(longer):
                wrapped.output.save()

"""Hooks and threads, and hook-name filters that select nothing.

A forward in one thread never runs the temporary hooks another thread added (run_with_hooks,
hooks(), run_with_cache); each thread's context removes only its own hooks. A `names_filter`
(string, list or function) that selects no hook point is an error naming the closest hooks."""

from __future__ import annotations

import threading

import pytest
import torch

from vlens.core.model import HookedVLM
from vlens.testing import tiny_hf_model, tiny_qwen_processor
from vlens.utils.errors import UserInputError

HOOK = "blocks.0.attn.hook_z"


@pytest.fixture(scope="module")
def model():
    return HookedVLM.from_hf(tiny_hf_model("qwen2_5_vl"), processor=tiny_qwen_processor())


@pytest.fixture(scope="module")
def inputs(model):
    return model.prepare(prompts=["how many red dots"], chat=False)


def _zero(z, hook):
    z[:] = 0
    return z


def test_a_forward_in_another_thread_never_sees_the_hooks(model, inputs):
    with torch.no_grad():
        clean = model(inputs)
        patched = model.run_with_hooks(inputs, fwd_hooks=[(HOOK, _zero)])
    assert (clean - patched).abs().max() > 1e-3  # the patch matters
    barrier = threading.Barrier(2, timeout=60)

    def held_open(z, hook):  # thread A's hook waits while thread B runs a whole forward
        barrier.wait()
        barrier.wait()
        return _zero(z, hook)

    def hooked(out: dict) -> None:
        with torch.no_grad():
            out["a"] = model.run_with_hooks(inputs, fwd_hooks=[(HOOK, held_open)])

    def plain(out: dict) -> None:
        barrier.wait()
        with torch.no_grad():
            out["b"] = model(inputs)
            _, cache = model.run_with_cache(inputs, names_filter=HOOK)
        out["z"] = cache[HOOK]
        barrier.wait()

    wrong = []
    for _ in range(15):
        out: dict[str, torch.Tensor] = {}
        threads = [threading.Thread(target=hooked, args=(out,)), threading.Thread(target=plain, args=(out,))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
        wrong.append(not torch.allclose(out["b"], clean, atol=1e-5) or not torch.allclose(out["a"], patched, atol=1e-5)
                     or bool((out["z"] == 0).all()))
    assert sum(wrong) == 0, f"{sum(wrong)} of 15 runs mixed the threads' hooks"
    assert not any(point.fwd_hooks for point in model.hook_dict.values())  # every context removed its own


def test_one_threads_context_does_not_remove_anothers_hooks(model, inputs):
    entered, leave = threading.Event(), threading.Event()
    counts = {}

    def counting(activation, hook):
        counts[threading.current_thread().name] = counts.get(threading.current_thread().name, 0) + 1

    def long_context():
        with model.hooks(fwd_hooks=[(HOOK, counting)]), torch.no_grad():
            entered.set()
            leave.wait(60)
            model(inputs)  # after the other thread's context ended: its own hook must still be there

    worker = threading.Thread(target=long_context, name="long")
    worker.start()
    entered.wait(60)
    with model.hooks(fwd_hooks=[(HOOK, counting)]), torch.no_grad():
        model(inputs)
    model.reset_hooks()  # this thread's reset: the other thread's hook stays
    leave.set()
    worker.join(60)
    assert counts == {"long": 1, threading.current_thread().name: 1}
    assert not any(point.fwd_hooks for point in model.hook_dict.values())


def test_permanent_hooks_apply_to_every_thread(model, inputs):
    seen = []
    model.add_hook(HOOK, lambda z, hook: seen.append(threading.current_thread().name), is_permanent=True)
    try:
        worker = threading.Thread(target=lambda: model(inputs), name="worker")
        worker.start()
        worker.join(60)
        assert seen == ["worker"]
    finally:
        model.reset_hooks(including_permanent=True)


@pytest.mark.parametrize("names_filter", ["blocks.0.hook_resid_prex", ["blocks.0.hook_resid_pre", "blocks.9.hook_z"],
                                          ("blocks.0.attn.hookz",)])
def test_a_misspelt_names_filter_names_the_closest_hooks(model, inputs, names_filter):
    with pytest.raises(UserInputError, match="Did you mean"):
        model.run_with_cache(inputs, names_filter=names_filter)


def test_a_filter_function_or_empty_list_that_selects_nothing_is_an_error(model, inputs):
    with pytest.raises(UserInputError, match="matches none of the model's"):
        model.run_with_cache(inputs, names_filter=lambda name: name.endswith("hook_zz"))
    with pytest.raises(UserInputError, match="is empty"):
        model.run_with_cache(inputs, names_filter=[])
    with pytest.raises(UserInputError, match="matches none"):
        model.run_with_hooks(inputs, fwd_hooks=[(lambda name: name == "nope", _zero)])
    _, cache = model.run_with_cache(inputs, names_filter=lambda name: name.endswith("hook_z"))
    assert len(cache) == model.cfg.n_layers


def test_a_hook_left_by_a_finished_thread_never_runs_in_a_thread_that_reuses_its_id(model, inputs):
    with torch.no_grad():
        clean = model(inputs)
    left: dict = {}

    def leave_a_hook() -> None:  # adds a temporary hook and ends without removing it
        model.add_hook(HOOK, _zero)
        left["ident"] = threading.get_ident()

    first = threading.Thread(target=leave_a_hook)
    first.start()
    first.join()
    point = model.hook_dict[HOOK]
    assert len(point.fwd_hooks) == 1
    reused, outputs = [], []

    def forward() -> None:
        reused.append(threading.get_ident() == left["ident"])
        with torch.no_grad():
            outputs.append(model(inputs))

    for _ in range(64):  # CPython hands a joined thread's id to a later thread (here: within a few)
        thread = threading.Thread(target=forward)
        thread.start()
        thread.join()
        if sum(reused) >= 2:
            break
    assert any(reused), "no thread reused the finished thread's id: the test checked nothing"
    assert all(torch.equal(out, clean) for out in outputs), "the finished thread's hook ran in a new thread"
    model.add_hook("blocks.1.attn.hook_z", _zero)  # hook points drop an ended thread's hooks as they change
    model.reset_hooks()
    assert point.fwd_hooks == [] and model.hook_dict["blocks.1.attn.hook_z"].fwd_hooks == []

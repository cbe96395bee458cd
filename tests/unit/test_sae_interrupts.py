"""The SAE and transcoder trainers compute their metrics only on logged steps (the logged numbers are the
ones every-step logging gives), and save their state when Ctrl-C or an error stops them, so that resume
ends on the same bits as a run that never stopped."""

from __future__ import annotations

import os
import signal

import pytest
import torch

from tests.unit.test_sae_training import planted
from vlens.sae.activations import TensorSource
from vlens.sae.settings import SAETraining, TrainRun
from vlens.sae.trainer import SAETrainer, train_sae
from vlens.transcoders.settings import TranscoderTraining
from vlens.transcoders.trainer import TranscoderTrainer, train_transcoders

TRAINING = SAETraining(architecture="jumprelu", d_sae=48, total_tokens=4_000, batch_size=128, buffer_size=1024,
                       lr=3e-3, warmup_steps=5, dead_window=1024, resample_every=7, dead_features="resample")


@pytest.fixture(scope="module")
def data():
    return planted(n=4_000)[0]


@pytest.fixture(scope="module")
def whole(data):
    return train_sae(TensorSource(data, 500), TRAINING, TrainRun(log_every=1))


def same_bits(a, b) -> None:
    for name, value in a.state_dict().items():
        assert torch.equal(b.state_dict()[name], value), name


def test_logged_steps_hold_the_numbers_every_step_logging_gives(data, whole):
    sparse = train_sae(TensorSource(data, 500), TRAINING, TrainRun(log_every=7))
    steps = [row["step"] for row in sparse.log]
    assert steps == [s for s in range(7, TRAINING.steps + 1, 7)] + ([TRAINING.steps] * (TRAINING.steps % 7 != 0))
    assert sparse.log == [row for row in whole.log if row["step"] in steps]
    same_bits(whole.sae, sparse.sae)


def test_a_step_not_logged_computes_no_metrics(data, monkeypatch):
    import vlens.sae.trainer as trainer_module

    calls = []
    original = trainer_module.explained_variance
    monkeypatch.setattr(trainer_module, "explained_variance", lambda *a: calls.append(1) or original(*a))
    train_sae(TensorSource(data, 500), TRAINING, TrainRun(log_every=10))
    assert len(calls) == TRAINING.steps // 10 + (TRAINING.steps % 10 != 0)


class Stop(Exception):
    pass


def fail_at(monkeypatch, cls, method: str, step: int, error) -> None:
    """`cls.method` raises `error()` (or calls it) when the trainer is at `step` steps done."""
    original = getattr(cls, method)

    def wrapped(self, *args, **kwargs):
        if self.step == step and not getattr(self, "failed", False):
            self.failed = True
            error()
        return original(self, *args, **kwargs)

    monkeypatch.setattr(cls, method, wrapped)


@pytest.mark.parametrize("how", ["KeyboardInterrupt", "error", "SIGINT"])
def test_a_stopped_run_saves_its_state_and_resume_ends_on_the_same_bits(tmp_path, monkeypatch, data, whole, how):
    # Python's own SIGINT handler, as a terminal's Ctrl-C finds it (a job started in the background by a
    # non-interactive shell, e.g. a CI runner, starts with SIGINT ignored, and the kill would do nothing)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        _stop_save_and_resume(tmp_path, monkeypatch, data, whole, how)
    finally:
        signal.signal(signal.SIGINT, previous)


def _stop_save_and_resume(tmp_path, monkeypatch, data, whole, how):
    deferred = how == "SIGINT" and signal.getsignal(signal.SIGINT) is signal.default_int_handler

    def stop():
        if how == "KeyboardInterrupt":
            raise KeyboardInterrupt
        if how == "error":
            raise Stop("the activation source failed")
        os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C: the step under way finishes first

    with monkeypatch.context() as patch:
        fail_at(patch, SAETrainer, "losses", 11, stop)
        with pytest.raises(KeyboardInterrupt if how != "error" else Stop), \
                pytest.warns(UserWarning, match="state is saved in"):
            train_sae(TensorSource(data, 500), TRAINING, TrainRun(checkpoint_dir=tmp_path, log_every=1,
                                                                  final_checkpoint=False))
    saved = torch.load(tmp_path / "trainer_state.pt", weights_only=True)
    assert saved["step"] == (12 if deferred else 11)
    resumed = train_sae(TensorSource(data, 500), TRAINING, TrainRun(checkpoint_dir=tmp_path, resume=True, log_every=1))
    assert resumed.metrics["finished"] and resumed.log == whole.log
    same_bits(whole.sae, resumed.sae)


def test_a_failing_read_of_the_stream_leaves_the_state_whole(tmp_path, monkeypatch, data, whole):
    source = TensorSource(data, 500)
    original = source.chunk
    reads = []

    def chunk(index):
        reads.append(index)
        if len(reads) == 6:
            raise Stop("disk error")
        return original(index)

    monkeypatch.setattr(source, "chunk", chunk)
    with pytest.raises(Stop), pytest.warns(UserWarning, match="state is saved"):
        train_sae(source, TRAINING, TrainRun(checkpoint_dir=tmp_path, log_every=1, final_checkpoint=False))
    resumed = train_sae(TensorSource(data, 500), TRAINING, TrainRun(checkpoint_dir=tmp_path, resume=True, log_every=1))
    assert resumed.log == whole.log
    same_bits(whole.sae, resumed.sae)


def test_an_error_inside_the_update_saves_nothing_and_says_so(tmp_path, monkeypatch, data):
    def broken_clipping(*args, **kwargs):
        raise Stop("inside the update")

    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", broken_clipping)
    with pytest.raises(Stop), pytest.warns(UserWarning, match="not whole, so it is not saved"):
        train_sae(TensorSource(data, 500), TRAINING, TrainRun(checkpoint_dir=tmp_path, final_checkpoint=False))
    assert not (tmp_path / "trainer_state.pt").exists()


def test_a_finished_run_without_final_checkpoint_writes_none(tmp_path, data):
    train_sae(TensorSource(data, 500), TRAINING, TrainRun(checkpoint_dir=tmp_path / "c", final_checkpoint=False))
    assert not (tmp_path / "c").exists()


def test_transcoders_save_their_state_on_an_interrupt_too(tmp_path, monkeypatch):
    g = torch.Generator().manual_seed(0)
    rows = torch.randn(3_000, 32, generator=g)  # (input, output) pairs of one layer of width 16
    training = TranscoderTraining(d_tc=32, total_tokens=3_000, batch_size=128, buffer_size=1024, lr=3e-3)
    whole = train_transcoders(TensorSource(rows, 500), training, TrainRun(log_every=1), layers=(0,))
    with monkeypatch.context() as patch:
        fail_at(patch, TranscoderTrainer, "losses", 9, lambda: (_ for _ in ()).throw(KeyboardInterrupt))
        with pytest.raises(KeyboardInterrupt), pytest.warns(UserWarning, match="state is saved"):
            train_transcoders(TensorSource(rows, 500), training, TrainRun(checkpoint_dir=tmp_path, log_every=1),
                              layers=(0,))
    resumed = train_transcoders(TensorSource(rows, 500), training,
                                TrainRun(checkpoint_dir=tmp_path, resume=True, log_every=1), layers=(0,))
    assert resumed.log == whole.log
    for name, value in whole.transcoders.state().items():
        assert torch.equal(value, resumed.transcoders.state()[name]), name

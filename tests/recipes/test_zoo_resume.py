"""`vlens zoo train` survives interruption: resumable state, bitwise-equal resumes, flags
checked before anything runs, and model folders that are replaced whole or not at all."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from vlens.cli import main
from vlens.recipes.embedded.loop import Interrupted, TrainingState, run_loop
from vlens.recipes.embedded.settings import Schedule

ROOT = Path(__file__).resolve().parents[2]
# a whole recipe stage in seconds: 56 px images (2 x 2 image tokens), 8 examples, 12 steps
TINY = (
    "--seed 7 --image-size 56 --examples 8 --batch-size 2 --steps 12 --warmup 1 --held-out 1 "
    "--probe-scenes 6 --checkpoint-every 2 --log-every 1 --threads 1 --quiet"
).split()


def _weights(folder: Path) -> dict[str, torch.Tensor]:
    return load_file(folder / "model.safetensors")


def _assert_bitwise_equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    assert all(torch.equal(a[name], b[name]) for name in a), [n for n in a if not torch.equal(a[n], b[n])]


# ------------------------------------------------------------------ the step loop
def _toy_run(directory: Path | None, interrupt_at: int | None = None) -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    x, y = torch.randn(32, 4), torch.randn(32, 1)

    def step_fn(step: int, rows: list[int]):
        if step == interrupt_at:
            os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C in the middle of a step
        noise = 0.01 * torch.randn(len(rows), 1)  # uses torch's global RNG: it must be restored too
        loss = torch.nn.functional.mse_loss(model(x[rows]), y[rows] + noise)
        return loss, {"loss": loss.item()}

    settings = Schedule(steps=10, batch_size=4, learning_rate=1e-2, warmup_steps=2, log_every=1, seed=3)
    state = TrainingState(directory, {"toy": 1}, checkpoint_every=100)  # no periodic checkpoint
    log = directory / "log.jsonl" if directory else os.devnull
    run_loop({"model": model}, step_fn, 32, settings, log, state, progress=False)
    return {name: tensor.clone() for name, tensor in model.state_dict().items()}


def test_ctrl_c_saves_a_whole_step_and_the_resumed_run_equals_an_uninterrupted_one(tmp_path):
    reference = _toy_run(None)
    handler = signal.getsignal(signal.SIGINT)
    with pytest.raises(Interrupted, match="after step 4.*--resume") as stop:
        _toy_run(tmp_path, interrupt_at=3)  # the step in progress completes, then the state is saved
    assert stop.value.step == 4
    saved = torch.load(tmp_path / "state.pt", weights_only=True)
    assert saved["step"] == 4 and [r["step"] for r in saved["log"] if "step" in r] == [1, 2, 3, 4]
    assert signal.getsignal(signal.SIGINT) is handler  # the loop's handler is gone
    _assert_bitwise_equal(_toy_run(tmp_path), reference)
    log = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log if "loss" in r] == list(range(1, 11))
    assert {"event": "resume", "step": 4} in log


def test_a_state_of_other_settings_is_refused(tmp_path):
    TrainingState(tmp_path, {"lr": 1}).save({"step": 1})
    with pytest.raises(ValueError, match="other settings \\(differing: lr\\)"):
        TrainingState(tmp_path, {"lr": 2}).load()


# ------------------------------------------------------------------ the command line
def test_killed_run_resumes_to_the_weights_of_an_uninterrupted_run(tmp_path):
    reference = tmp_path / "reference"
    assert main(["zoo", "train", "--out", str(reference), *TINY]) == 0
    assert not (tmp_path / "reference.checkpoint").exists()  # removed once the folder is written

    out, state = tmp_path / "killed", tmp_path / "killed.checkpoint" / "state.pt"
    command = [sys.executable, "-m", "vlens", "zoo", "train", "--out", str(out), *TINY]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 600
    while not state.exists() and process.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    process.kill()  # SIGKILL: no handler runs; only the periodic checkpoint survives
    process.wait()
    assert state.exists() and not out.exists(), process.stderr.read().decode()[-2000:]
    killed_at = torch.load(state, weights_only=True)["step"]
    assert 2 <= killed_at < 12

    assert main(["zoo", "train", "--out", str(out), *TINY]) == 2  # a saved state needs --resume
    assert main(["zoo", "train", "--out", str(out), *TINY, "--resume"]) == 0
    _assert_bitwise_equal(_weights(out), _weights(reference))
    records = [json.loads(line) for line in (out / "training_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "loss" in r] == list(range(1, 13))
    assert records[-1]["event"] == "final"


@pytest.mark.parametrize(
    ("flag", "value", "expected"),
    [
        ("--steps", "0", "integer >= 1"),
        ("--steps", "-5", "integer >= 1"),
        ("--examples", "0", "integer >= 1"),
        ("--batch-size", "-1", "integer >= 1"),
        ("--checkpoint-every", "0", "integer >= 1"),
        ("--log-every", "0", "integer >= 1"),
        ("--warmup", "-1", "integer >= 0"),
        ("--image-size", "0", "integer in [28, 4096]"),
        ("--image-size", "100", "multiple of 28"),
        ("--vision-aux-weight", "nan", "finite number >= 0"),
        ("--vision-aux-weight", "inf", "finite number >= 0"),
        ("--lr", "0", "finite number > 0"),
        ("--lr", "nan", "finite number > 0"),
        ("--stop-after", "0", "integer >= 1"),
        ("--probe-scenes", "2", "integer >= 3"),
    ],
)
def test_bad_flags_are_refused_before_anything_runs(tmp_path, capsys, flag, value, expected):
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exit_info:
        main(["zoo", "train", "--out", str(out), flag, value])
    assert exit_info.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert flag in error and expected in error and repr(value) in error
    assert not out.exists()


def test_a_held_out_source_in_the_mix_is_one_clear_error(tmp_path, capsys):
    assert main(["zoo", "train", "--out", str(tmp_path / "o"), "--mix", "foreign/shape=1"]) == 2
    assert "held out of every training stage" in capsys.readouterr().err


def test_an_existing_model_folder_is_kept_unless_overwrite(tmp_path, capsys, monkeypatch):
    out = tmp_path / "model"
    assert main(["zoo", "train", "--out", str(out), *TINY]) == 0
    before = {path.name: path.read_bytes() for path in out.iterdir()}

    assert main(["zoo", "train", "--out", str(out), *TINY]) == 2
    assert "already holds a model" in capsys.readouterr().err
    assert {path.name: path.read_bytes() for path in out.iterdir()} == before  # the log too

    # a run that fails after training started leaves the old folder as it was
    import vlens.recipes.embedded.recipe as recipe

    def broken(*args, **kwargs):
        raise RuntimeError("evaluation failed")

    monkeypatch.setattr(recipe, "evaluate_samples", broken)
    capsys.readouterr()
    # an internal failure is one line at the command-line boundary (exit 1: a bug, not the user's)
    assert main(["zoo", "train", "--out", str(out), *TINY, "--seed", "8", "--overwrite"]) == 1
    assert "RuntimeError: evaluation failed" in capsys.readouterr().err
    assert {path.name: path.read_bytes() for path in out.iterdir()} == before
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".model.")]  # no temporary left
    monkeypatch.undo()

    assert main(["zoo", "train", "--out", str(out), *TINY, "--seed", "8", "--overwrite", "--resume"]) == 0
    assert json.loads((out / "evaluation.json").read_text())["training"]["seed"] == 8


def test_evaluate_write_changes_nothing_unless_the_evaluation_succeeds(tmp_path, capsys):
    out = tmp_path / "model"
    assert main(["zoo", "train", "--out", str(out), *TINY]) == 0
    summary = json.loads((out / "evaluation.json").read_text())
    summary["training"]["steps"] = 4  # pretend it is the checkpoint at step 4
    (out / "evaluation.json").write_text(json.dumps(summary))
    weights = (out / "model.safetensors").read_bytes()
    (out / "model.safetensors").write_bytes(b"not a safetensors file")
    before = {path.name: path.read_bytes() for path in out.iterdir()}
    capsys.readouterr()
    assert main(["zoo", "evaluate", "--model", str(out), "--write", "--held-out", "1"]) == 2
    assert "not a valid safetensors weights file" in capsys.readouterr().err
    assert {path.name: path.read_bytes() for path in out.iterdir()} == before  # log not trimmed

    (out / "model.safetensors").write_bytes(weights)
    assert main(["zoo", "evaluate", "--model", str(out), "--write", "--held-out", "1"]) == 0
    steps = [
        json.loads(line).get("step", 0) for line in (out / "training_log.jsonl").read_text().splitlines()
    ]
    assert max(steps) == 4
    assert "4 steps (of a 12-step schedule)" in (out / "MODEL_CARD.md").read_text()

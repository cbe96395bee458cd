"""The recipe's step loop: AdamW with linear warm-up then cosine decay, gradient clipping,
a JSONL log, a tqdm bar, and resumable checkpoints.

Every `checkpoint_every` steps, and when the run is interrupted (Ctrl-C, SIGTERM), the loop
saves the full training state (module weights, optimizer, the batch-sampling generator,
torch's global RNG, the running loss and the log so far) into `TrainingState.path`. A run
started again on the same state continues exactly where it stopped: on the CPU, with the
same thread count, its final weights equal an uninterrupted run's bit for bit.
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm.auto import tqdm

from vlens.recipes.embedded.settings import Schedule
from vlens.training.schedule import learning_rate_at
from vlens.utils.errors import UserInputError
from vlens.utils.fileio import atomic_write, load_tensor_file

STATE_FILE = "state.pt"
RESTART_HINT = "pass --overwrite to discard it and start this stage afresh"


def rate_at(settings: Schedule, step: int) -> float:
    """The learning rate of step `step` (0-based): linear warm-up to settings.learning_rate,
    then cosine decay to 5% of it."""
    return learning_rate_at(
        step, settings.steps, settings.learning_rate, settings.warmup_steps, "cosine", floor=0.05
    )


class Interrupted(Exception):
    """Training stopped by Ctrl-C or SIGTERM after its state was saved."""

    def __init__(self, step: int, path: Path | None) -> None:
        where = (
            f"; its state is saved in {path}: run the same command with --resume to continue" if path else ""
        )
        super().__init__(f"training interrupted after step {step}{where}")
        self.step, self.path = step, path


@dataclass
class TrainingState:
    """Where a run keeps its resumable state, and the identity of the run it belongs to
    (`fingerprint`: every setting that changes the trajectory)."""

    directory: Path | None
    fingerprint: dict = field(default_factory=dict)
    checkpoint_every: int = 0

    @property
    def path(self) -> Path | None:
        return None if self.directory is None else self.directory / STATE_FILE

    def load(self) -> dict | None:
        """The saved state of this run, or None; UserInputError if it belongs to another run."""
        if self.path is None or not self.path.is_file():
            return None
        state = load_tensor_file(self.path, "the saved training state", RESTART_HINT)
        if not isinstance(state, dict) or not isinstance(state.get("fingerprint"), dict):
            raise UserInputError(f"the saved training state {self.path} is not one this recipe writes: {RESTART_HINT}")
        if state["fingerprint"] != self.fingerprint:
            differing = sorted(
                key
                for key in set(state["fingerprint"]) | set(self.fingerprint)
                if state["fingerprint"].get(key) != self.fingerprint.get(key)
            )
            raise UserInputError(
                f"the training state in {self.directory} belongs to a run with other settings "
                f"(differing: {', '.join(differing)}); resume with the same settings, or pass "
                "--overwrite to start afresh"
            )
        return state

    def save(self, state: dict) -> None:
        if self.directory is None:
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        # plain data only (read back with weights_only=True); a kill during the save keeps the previous state
        atomic_write(self.directory / STATE_FILE, lambda path: torch.save({**state, "fingerprint": self.fingerprint}, path))


@contextmanager
def stop_requests() -> Iterator[dict]:
    """Inside the block Ctrl-C (SIGINT) and SIGTERM do not stop the process at once: they
    set flag["stop"], which the loop checks between steps, so the saved state is always a
    whole step (a second Ctrl-C stops at once). Previous handlers are restored on exit."""
    flag = {"stop": False}

    def request(signum, _frame):
        if flag["stop"] and signum == signal.SIGINT:
            raise KeyboardInterrupt
        flag["stop"] = True

    try:
        previous = {sig: signal.signal(sig, request) for sig in (signal.SIGINT, signal.SIGTERM)}
    except ValueError:  # not the main thread: signals stay as they are
        yield flag
        return
    try:
        yield flag
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


StepFn = Callable[[int, list[int]], tuple[torch.Tensor, dict[str, float]]]


def run_loop(
    modules: dict[str, torch.nn.Module],
    step_fn: StepFn,
    n_rows: int,
    settings: Schedule,
    log_path: str | Path,
    state: TrainingState | None = None,
    on_checkpoint: Callable[[int], dict] | None = None,
    progress: bool = True,
    description: str = "zoo train",
    loss_name: str = "loss",
) -> dict:
    """Run `settings.steps_to_run` optimiser steps over the trainable parameters of `modules`.

    Each step draws `settings.batch_size` rows (uniformly, with replacement) from
    range(n_rows) with the run's generator and calls `step_fn(step, rows)` (step counts from
    0; derive any other randomness from it, so a resumed run draws the same), which returns the loss
    to minimise and numbers to log (`loss_name` is smoothed into "smoothed_loss").
    `on_checkpoint(step)` runs after each periodic checkpoint (e.g. a quick evaluation);
    what it returns is logged. Returns {"steps", "wall_time_s", "final_loss"}.
    """
    state = state or TrainingState(None)
    parameters = [p for module in modules.values() for p in module.parameters() if p.requires_grad]
    if not parameters:
        raise UserInputError("nothing to train: every parameter is frozen")
    optimizer = torch.optim.AdamW(
        parameters, lr=settings.learning_rate, weight_decay=settings.weight_decay, betas=(0.9, 0.98)
    )
    generator = torch.Generator().manual_seed(settings.seed)
    start_step, running, records, elapsed_before = 0, None, [], 0.0
    saved = state.load()
    if saved is not None:
        for name, module in modules.items():
            module.load_state_dict(saved["modules"][name])
        optimizer.load_state_dict(saved["optimizer"])
        generator.set_state(saved["generator"])
        torch.set_rng_state(saved["torch_rng"])
        start_step, running, records = saved["step"], saved["running"], saved["log"]
        elapsed_before = saved["elapsed_s"]
    if settings.steps_to_run < 1:
        raise UserInputError(f"nothing to run: {settings.steps_to_run} steps")
    if start_step > settings.steps_to_run:
        raise UserInputError(
            f"the saved state in {state.directory} is at step {start_step}, beyond the "
            f"{settings.steps_to_run} steps asked for"
        )
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log_path.write_text("".join(json.dumps(record) + "\n" for record in records))
    written = len(records)
    if not records:
        records.append({"event": "start", "settings": settings.__dict__.copy(), "rows": n_rows})
    elif start_step < settings.steps_to_run:
        records.append({"event": "resume", "step": start_step})
    start = time.time() - elapsed_before

    def snapshot(step: int) -> dict:
        return {
            "step": step,
            "modules": {name: module.state_dict() for name, module in modules.items()},
            "optimizer": optimizer.state_dict(),
            "generator": generator.get_state(),
            "torch_rng": torch.get_rng_state(),
            "running": running,
            "log": records,
            "elapsed_s": time.time() - start,
        }

    for module in modules.values():
        module.train()
    step = start_step
    with (
        log_path.open("a") as log,
        tqdm(total=settings.steps_to_run, initial=start_step, disable=not progress, desc=description) as bar,
        stop_requests() as stop,
    ):

        def flush() -> None:
            nonlocal written
            for record in records[written:]:
                log.write(json.dumps(record) + "\n")
            written = len(records)
            log.flush()

        flush()
        while step < settings.steps_to_run:
            if stop["stop"]:
                state.save(snapshot(step))
                raise Interrupted(step, state.path)
            rows = torch.randint(n_rows, (settings.batch_size,), generator=generator).tolist()
            for group in optimizer.param_groups:
                group["lr"] = rate_at(settings, step)
            loss, numbers = step_fn(step, rows)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(parameters, settings.grad_clip)
            optimizer.step()
            step += 1
            value = numbers[loss_name]
            running = value if running is None else 0.98 * running + 0.02 * value
            bar.update(1)
            bar.set_postfix(loss=f"{running:.4f}")
            if step % settings.log_every == 0 or step == settings.steps_to_run:
                records.append(
                    {
                        "step": step,
                        **numbers,
                        "smoothed_loss": running,
                        "lr": optimizer.param_groups[0]["lr"],
                        "elapsed_s": round(time.time() - start, 1),
                    }
                )
                flush()
            if state.checkpoint_every and step % state.checkpoint_every == 0:
                if on_checkpoint is not None and step < settings.steps_to_run:
                    for module in modules.values():
                        module.eval()
                    extra = on_checkpoint(step)
                    for module in modules.values():
                        module.train()
                    records.append({"event": "checkpoint", "step": step, **extra})
                    flush()
                state.save(snapshot(step))
    if state.path is not None and step == settings.steps_to_run:
        state.save(snapshot(step))  # the stopping point (a --stop-after run may continue later)
    for module in modules.values():
        module.eval()
    return {
        "steps": settings.steps_to_run,
        "wall_time_s": round(time.time() - start, 1),
        "final_loss": running,
        "log": records,
    }

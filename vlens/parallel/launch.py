"""Starting a sharded run under `torchrun`: the process group, each rank's device, clean failure.

    torchrun --nproc-per-node 8 -m vlens patch --model M --make-pairs 1000 --mode layer-head --out heads.json

`torchrun` starts the processes and sets RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR /
MASTER_PORT (and OMP_NUM_THREADS=1 when it starts more than one; with one process vlens sets
one torch thread itself unless OMP_NUM_THREADS is given, because CPU kernels round differently
with other thread counts: a 1-process and an N-process run then give the same bits); `from_env()` joins them into one process group (gloo on CPU; gloo for vlens's own
object collectives plus nccl for CUDA tensors on GPUs) with a timeout (`VLENS_DIST_TIMEOUT_S`,
default 1800 s), and returns the `Sharding`. Without torchrun (or with one process) it returns
the single-process layout and starts nothing.

The group is left when the process exits (a second `init_process_group` in the same torchrun
worker would wait forever), so several commands may run one after the other in one process;
after a lost peer the process ends with status 1 without the group's teardown
(`vlens.parallel.teardown`: gloo's teardown may abort with a dead peer).

When one process fails, torchrun stops the others with SIGTERM (and restarts them all when run
with `--max-restarts N`: the restarted run resumes from the finished units). `stop_on_sigterm`
turns that SIGTERM into a `DistributedRunError` with a message, instead of a silent exit.
"""

from __future__ import annotations

import os
import signal
from contextlib import contextmanager
from datetime import timedelta

from vlens.parallel.sharding import DistributedRunError, Sharding
from vlens.parallel.teardown import register_exit_handlers
from vlens.utils.errors import UserInputError

TIMEOUT_ENV = "VLENS_DIST_TIMEOUT_S"
BACKEND_ENV = "VLENS_DIST_BACKEND"
DEFAULT_TIMEOUT_S = 1800.0


def launched_by_torchrun() -> bool:
    """True in a process that torchrun (or another launcher setting RANK and WORLD_SIZE) started."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def timeout_seconds() -> float:
    raw = os.environ.get(TIMEOUT_ENV)
    if raw is None:
        return DEFAULT_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if value <= 0:
        raise UserInputError(f"{TIMEOUT_ENV}={raw!r}: give the collective timeout in seconds, a positive number")
    return value


def default_backend() -> str:
    """gloo on CPU; on CUDA gloo for object collectives and nccl for CUDA tensors."""
    import torch

    if os.environ.get(BACKEND_ENV):
        return os.environ[BACKEND_ENV]
    return "cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo"


def from_env() -> Sharding:
    """The run's `Sharding` from torchrun's environment, joining (once) its process group.

    One process (no torchrun, or `--nproc-per-node 1`) starts no process group.
    """
    import torch
    import torch.distributed as dist

    if not launched_by_torchrun():
        return Sharding()
    if "OMP_NUM_THREADS" not in os.environ:
        # torchrun gives each of several processes one thread; one process would take every core,
        # and CPU kernels round differently with another thread count: same threads, same bits
        torch.set_num_threads(1)
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    if world_size == 1:
        return Sharding(local_rank=local_rank)
    if not dist.is_initialized():  # once per process: later commands in it reuse the group
        if torch.cuda.is_available():
            torch.cuda.set_device(local_rank)
        dist.init_process_group(backend=default_backend(), timeout=timedelta(seconds=timeout_seconds()))
        register_exit_handlers()
    return Sharding(rank=dist.get_rank(), world_size=dist.get_world_size(), local_rank=local_rank)


def rank_device(sharding: Sharding, requested: str | None = None) -> str | None:
    """The device this process should run on.

    One process: `requested` unchanged (None: wherever the model loads). Several: a bare
    "cuda", "auto" or None become ``cuda:{local_rank}`` when CUDA is available (one GPU per
    process), else "cpu"; "cpu" stays "cpu"; an explicit "cuda:N" is refused (all processes
    would share one GPU).
    """
    if not sharding.distributed:
        return requested
    import torch

    if requested is None or requested in ("cuda", "auto"):
        if torch.cuda.is_available():
            return f"cuda:{sharding.local_rank}"
        if requested == "cuda":
            raise UserInputError("--device cuda: CUDA is not available on this machine")
        return "cpu"
    if requested.startswith("cuda:"):
        raise UserInputError(f"--device {requested}: in a sharded run each process takes its own GPU "
                         f"(cuda:LOCAL_RANK); pass --device cuda")
    return requested


@contextmanager
def stop_on_sigterm(sharding: Sharding):
    """Inside: SIGTERM (torchrun stopping this process because another failed) raises a
    `DistributedRunError` that says so. The previous handler is restored on exit."""
    if not sharding.distributed:
        yield
        return

    def handler(signum, frame):
        raise DistributedRunError(
            f"rank {sharding.rank} was stopped (SIGTERM): torchrun ends every process of a run when one of them "
            "fails; its error and exit code are in torchrun's summary. No result was written."
            f"{sharding.resume_hint()}")

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)

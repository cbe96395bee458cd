"""Launch `vlens` under torchrun from a test: gloo on the CPU, one thread per process, a free port.

`python -m tests.helpers.torchrun CMD1 ARGS ... --then CMD2 ARGS ...` (as a torchrun worker) runs
several `vlens` commands one after the other in the same processes, exactly as `python -m vlens`
runs one, so that a test pays torchrun's start-up (importing torch in every process) once.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
THEN = "--then"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(module: str, args: list[str], nproc: int = 2, timeout: float = 600.0,
             env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """`python -m torch.distributed.run --nproc-per-node NPROC -m MODULE ARGS` (its output captured)."""
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
               "--master-addr", "127.0.0.1", "--master-port", str(free_port()), "-m", module, *args]
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": path, **(env or {})}
    return subprocess.run(command, env=full_env, cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def main(argv: list[str]) -> int:
    from vlens.cli import main as vlens_main

    commands, current = [], []
    for arg in argv:
        if arg == THEN:
            commands.append(current)
            current = []
        else:
            current.append(arg)
    commands.append(current)
    for command in commands:
        status = vlens_main(command)
        if status:
            return status
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

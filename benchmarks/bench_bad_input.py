"""How long a misspelt input path takes to fail, against the bare interpreter's start-up.

    python benchmarks/bench_bad_input.py --runs 15

Each case is a fresh process, run interleaved with the others (so machine load hits every case
alike): the bare interpreter (`python -c pass`, the floor), and commands whose input path does
not exist (`vlens patch --pairs missing`, `vlens logit-lens --data missing`, `vlens eval --data
missing`, `vlens ablate --data missing`). Reported: the median and the minimum wall clock, and the
median CPU time (user + system) of the process, each also as a multiple of the floor's. Every case
must exit 2 with one line on stderr; the script checks it.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = str(Path(__file__).resolve().parents[1])  # this checkout's vlens


def cases(out: str) -> dict[str, list[str]]:
    vlens = [sys.executable, "-m", "vlens"]
    return {
        "python -c pass (floor)": [sys.executable, "-c", "pass"],
        "vlens patch --pairs missing": [*vlens, "patch", "--pairs", "missing", "--mode", "layer-head", "--out", out],
        "vlens logit-lens --data missing": [*vlens, "logit-lens", "--data", "missing", "--out", out],
        "vlens eval --data missing": [*vlens, "eval", "--data", "missing", "--out", out],
        "vlens ablate --data missing": [*vlens, "ablate", "--data", "missing", "--out", out],
    }


def run_once(argv: list[str]) -> tuple[float, float, int, str]:
    """(wall s, CPU s of the child, exit status, stderr)."""
    env = {**os.environ, "PYTHONPATH": HERE}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(argv, env=env, cwd=HERE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, done.returncode, done.stderr


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15, help="runs per case (default 15)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        table = cases(str(Path(tmp) / "out"))
        walls: dict[str, list[float]] = {name: [] for name in table}
        cpus: dict[str, list[float]] = {name: [] for name in table}
        for _ in range(args.runs):
            for name, argv in table.items():
                wall, cpu, status, stderr = run_once(argv)
                if name.startswith("vlens"):
                    lines = stderr.strip().splitlines()
                    if status != 2 or len(lines) != 1:
                        raise SystemExit(f"{name}: expected exit 2 and one line, got {status}: {stderr!r}")
                walls[name].append(wall)
                cpus[name].append(cpu)
    floor_wall = statistics.median(walls["python -c pass (floor)"])
    floor_cpu = statistics.median(cpus["python -c pass (floor)"])
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}, {args.runs} runs per case")
    print(f"{'case':36s} {'median s':>9s} {'min s':>7s} {'x floor':>8s} {'CPU s':>7s} {'x floor':>8s}")
    for name in table:
        wall, cpu = statistics.median(walls[name]), statistics.median(cpus[name])
        print(f"{name:36s} {wall:9.3f} {min(walls[name]):7.3f} {wall / floor_wall:8.2f} {cpu:7.3f} "
              f"{cpu / floor_cpu:8.2f}")


if __name__ == "__main__":
    main()

"""How long `vlens --help` takes, against the bare interpreter and the dispatcher before lazy imports.

    git archive e7ee708 vlens | tar -x -C /tmp/vlens-before     # the dispatcher before lazy imports
    python benchmarks/bench_cli_help.py --runs 7 --before /tmp/vlens-before

Each case is a fresh process (wall clock, median of --runs interleaved runs): the bare
interpreter (`python -c pass`, the floor), `vlens --help`, `vlens data syndot --help`, every
other `vlens COMMAND --help` (--all-commands) and, with --before, the same two help calls on an
older vlens tree (PYTHONPATH=that tree), which imported every command module up front.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = str(Path(__file__).resolve().parents[1])  # this checkout's vlens


def cases(commands: list[str], before: str | None) -> dict[str, tuple[list[str], str]]:
    """name -> (argv, PYTHONPATH)."""
    python = [sys.executable]
    out = {
        "python -c pass (floor)": ([*python, "-c", "pass"], HERE),
        "vlens --help": ([*python, "-m", "vlens", "--help"], HERE),
        "vlens data syndot --help": ([*python, "-m", "vlens", "data", "syndot", "--help"], HERE),
    }
    for name in commands:
        out[f"vlens {name} --help"] = ([*python, "-m", "vlens", name, "--help"], HERE)
    if before:
        out["before: vlens --help"] = ([*python, "-m", "vlens.cli", "--help"], before)
        out["before: vlens data syndot --help"] = ([*python, "-m", "vlens.cli", "data", "syndot", "--help"], before)
    return out


def time_once(argv: list[str], pythonpath: str) -> float:
    env = {**os.environ, "PYTHONPATH": pythonpath}
    start = time.perf_counter()
    # run inside the tree: `python -m` puts the working folder first on sys.path
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, cwd=pythonpath)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7, help="runs per case (default 7)")
    parser.add_argument("--before", help="an older vlens tree to time too (its parent folder holds vlens/)")
    parser.add_argument("--before-runs", type=int, default=3, help="runs of the slow older tree (default 3)")
    parser.add_argument("--all-commands", action="store_true", help="also time every COMMAND --help")
    args = parser.parse_args()

    from vlens.cli import COMMANDS

    table = cases([c.name for c in COMMANDS if c.name != "data"] if args.all_commands else [], args.before)
    times: dict[str, list[float]] = {name: [] for name in table}
    for run in range(args.runs):
        for name, (argv, pythonpath) in table.items():  # interleaved, so machine load hits every case alike
            if name.startswith("before:") and run >= args.before_runs:
                continue
            times[name].append(time_once(argv, pythonpath))
    floor = statistics.median(times["python -c pass (floor)"])
    print(f"{'case':44s} {'median s':>9s} {'min s':>7s} {'x floor':>8s}")
    for name, values in times.items():
        median = statistics.median(values)
        print(f"{name:44s} {median:9.3f} {min(values):7.3f} {median / floor:8.1f}")


if __name__ == "__main__":
    main()

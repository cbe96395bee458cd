"""How long `vlens --help` takes, against the bare interpreter and the old eager import of every command.

    python benchmarks/bench_cli_help.py --runs 7

Each case is a fresh process (wall clock, median of --runs interleaved runs): the bare
interpreter (`python -c pass`, the floor), `vlens --help`, `vlens data syndot --help`, every
other `vlens COMMAND --help`, and, as the old dispatcher's cost, importing the modules it used to
import before printing help (every method package, hence torch and transformers).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

EAGER = ("import vlens.data, vlens.evaluation.runner, vlens.patching.sweeps, vlens.lens.logit_lens, "
         "vlens.lens.headlens, vlens.ablation.study, vlens.training.sft, vlens.interventions.temperature, "
         "vlens.demo.pipeline")


def cases(commands: list[str]) -> dict[str, list[str]]:
    python = [sys.executable]
    out = {
        "python -c pass (floor)": [*python, "-c", "pass"],
        "vlens --help": [*python, "-m", "vlens", "--help"],
        "vlens data syndot --help": [*python, "-m", "vlens", "data", "syndot", "--help"],
    }
    for name in commands:
        out[f"vlens {name} --help"] = [*python, "-m", "vlens", name, "--help"]
    out["old: import every command's module"] = [*python, "-c", EAGER]
    return out


def time_once(argv: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7, help="runs per case (default 7)")
    parser.add_argument("--eager-runs", type=int, default=3, help="runs of the slow eager import (default 3)")
    parser.add_argument("--all-commands", action="store_true", help="also time every COMMAND --help")
    args = parser.parse_args()

    from vlens.cli import COMMANDS

    table = cases([c.name for c in COMMANDS if c.name != "data"] if args.all_commands else [])
    times: dict[str, list[float]] = {name: [] for name in table}
    for run in range(args.runs):
        for name, argv in table.items():  # interleaved, so machine load hits every case alike
            if name.startswith("old:") and run >= args.eager_runs:
                continue
            times[name].append(time_once(argv))
    floor = statistics.median(times["python -c pass (floor)"])
    print(f"{'case':44s} {'median s':>9s} {'min s':>7s} {'x floor':>8s}")
    for name, values in times.items():
        median = statistics.median(values)
        print(f"{name:44s} {median:9.3f} {min(values):7.3f} {median / floor:8.1f}")


if __name__ == "__main__":
    main()

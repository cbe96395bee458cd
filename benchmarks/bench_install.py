"""What the README's set-up commands install: time and package count per extra, each in a fresh venv.

For each extra (default: demo, test, dev), in a new venv under a temporary folder: `pip install
torch==2.13.0` (the CPU wheel, first, as the README says), then `pip install -e ".[EXTRA]"` from a
clean copy of the repository (`git archive HEAD`), both under `nice -n 10`. Reported: wall and CPU
seconds (user + system of pip and its children) of the second step, and the number of packages in
the venv after it (`pip list`, pip and setuptools not counted) and added by it. The pip cache and the
machine's package index are used as configured (say which in RESULTS.md).

    python benchmarks/bench_install.py [--extras demo,test,dev] [--keep]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BASE = {"pip", "setuptools", "wheel"}


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _run(command: list[str], cwd: Path | None = None) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), _children_cpu()
    subprocess.run(["nice", "-n", "10", *command], cwd=cwd, check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.PIPE)
    return time.perf_counter() - wall, _children_cpu() - cpu


def _packages(python: Path) -> set[str]:
    out = subprocess.run([str(python), "-m", "pip", "list", "--format=json"], check=True, capture_output=True,
                         text=True).stdout
    return {row["name"].lower() for row in json.loads(out)} - BASE


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--extras", default="demo,test,dev")
    parser.add_argument("--keep", action="store_true", help="keep the venvs")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="vlens-install-"))
    source = work / "src"
    source.mkdir()
    archive = subprocess.run(["git", "archive", "HEAD"], cwd=ROOT, check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(source)], input=archive, check=True)
    results = {"load_average_start": os.getloadavg()}
    for extra in args.extras.split(","):
        venv = work / f"venv-{extra}"
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        python = venv / "bin" / "python"
        torch_wall, torch_cpu = _run([str(python), "-m", "pip", "install", "--quiet", "torch==2.13.0"])
        before = _packages(python)
        wall, cpu = _run([str(python), "-m", "pip", "install", "--quiet", "-e", f".[{extra}]"], cwd=source)
        after = _packages(python)
        results[extra] = {"torch_step_s": round(torch_wall, 1), "torch_step_cpu_s": round(torch_cpu, 1),
                          "install_s": round(wall, 1), "install_cpu_s": round(cpu, 1),
                          "packages": len(after), "added_by_the_extra_step": len(after - before)}
        print(extra, results[extra], flush=True)
        if not args.keep:
            shutil.rmtree(venv)
    results["load_average_end"] = os.getloadavg()
    print(json.dumps(results, indent=1))
    if not args.keep:
        shutil.rmtree(work)


if __name__ == "__main__":
    main()

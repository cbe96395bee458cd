"""What `import vlens.core.model` costs, as a ratio to `import torch` measured in the same run.

    python benchmarks/bench_import.py --runs 7

Each case is a fresh interpreter under `python -X importtime`; a case's import time is the sum of
the cumulative times of its top-level imports (interpreter start-up excluded). Cases run
interleaved, --runs times each; medians are reported with each case's ratio to `import torch`:

- import torch;
- import vlens; import vlens.core.model (TransformerLens's packages deferred: vlens.utils.tl_modules);
- the same after `import transformer_lens` (TransformerLens's whole package first: what vlens cost
  before it deferred the packages, and what it costs a script that imports TransformerLens itself);
- import transformer_lens alone.

It also prints whether each case loaded `datasets` / `pandas`.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = str(Path(__file__).resolve().parents[1])
CASES = {
    "import torch": "import torch",
    "import vlens; import vlens.core.model": "import vlens; import vlens.core.model",
    "import transformer_lens; import vlens; import vlens.core.model (before)":
        "import transformer_lens; import vlens; import vlens.core.model",
    "import transformer_lens": "import transformer_lens",
}
_LINE = re.compile(r"import time:\s+(\d+) \|\s+(\d+) \| ( *)(\S+)")


def import_seconds(code: str) -> tuple[float, list[str]]:
    """(seconds in top-level imports, which of datasets / pandas were imported) of one fresh interpreter."""
    probe = f"{code}\nimport sys\nprint([m for m in ('datasets', 'pandas') if m in sys.modules])"
    env = {**os.environ, "PYTHONPATH": ROOT}
    done = subprocess.run([sys.executable, "-X", "importtime", "-c", probe], capture_output=True, text=True,
                          env=env, cwd=ROOT, check=True)
    total = 0
    for line in done.stderr.splitlines():
        match = _LINE.match(line)
        if match and match[3] == "":  # a top-level import: its cumulative time holds everything under it
            total += int(match[2])
    return total / 1e6, eval(done.stdout.strip().splitlines()[-1])  # noqa: S307 - our own print of a list


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7, help="interleaved runs per case (default 7)")
    args = parser.parse_args()
    times: dict[str, list[float]] = {name: [] for name in CASES}
    loaded: dict[str, list[str]] = {}
    for _ in range(args.runs):
        for name, code in CASES.items():
            (seconds, heavy) = import_seconds(code)
            times[name].append(seconds)
            loaded[name] = heavy
    torch_median = statistics.median(times["import torch"])
    print(f"{'case':<75} {'median s':>9} {'x torch':>8}  per-run ratios (min-max)   loads")
    for name, values in times.items():
        ratios = [v / t for v, t in zip(values, times["import torch"], strict=True)]
        median = statistics.median(values)
        print(f"{name:<75} {median:9.3f} {median / torch_median:8.2f}  {min(ratios):.2f}-{max(ratios):.2f}"
              f"                 {', '.join(loaded[name]) or '-'}")
    print(f"load average at the end: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()

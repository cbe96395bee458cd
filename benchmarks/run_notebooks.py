"""Execute the demos/ notebooks in place, keeping their outputs (figures as plotly JSON + a static PNG).

    python benchmarks/run_notebooks.py                 # every notebook
    python benchmarks/run_notebooks.py 02_counting_circuit.ipynb

Run after changing a notebook or the embedded model's weights (benchmarks/regenerate_figures.py
calls it). Needs the dev extra (nbclient, ipykernel) and kaleido + a Chrome / Chromium for the PNGs.
Outputs are made deterministic where they can be: no execution timestamps, one torch thread.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

DEMOS = Path(__file__).resolve().parents[1] / "demos"
TIMEOUT_S = 600


def run_notebook(path: Path) -> float:
    import nbclient
    import nbformat

    notebook = nbformat.read(path, as_version=4)
    start = time.perf_counter()
    os.environ.setdefault("VLENS_THREADS", "1")
    os.environ["VLENS_STATIC_FIGURES"] = "1"
    client = nbclient.NotebookClient(notebook, timeout=TIMEOUT_S, kernel_name="python3",
                                     resources={"metadata": {"path": str(path.parent)}})
    client.execute()
    for cell in notebook.cells:  # timestamps would change every run
        cell.metadata.pop("execution", None)
    notebook.metadata.pop("widgets", None)
    nbformat.validate(notebook)
    nbformat.write(notebook, path)
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("names", nargs="*", help="notebook file names in demos/ (default: all)")
    args = parser.parse_args()
    paths = [DEMOS / name for name in args.names] if args.names else sorted(DEMOS.glob("*.ipynb"))
    for path in paths:
        seconds = run_notebook(path)
        print(f"{path.name}: executed in {seconds:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

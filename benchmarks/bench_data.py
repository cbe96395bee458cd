"""Benchmark of the synthetic data layer: the training set of the paper's recipe
(4,000 SynDot + 4,000 SynPoly images, 224 px) written as imagefolders.

    python benchmarks/bench_data.py --workers 2

Target (issue 4): <= 30 s on 2 cores. Prints the time per part, the total, the load
average (the machine may be shared) and the size on disk.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

from vlens.data.generate import DatasetSpec, generate_dataset


def disk_mb(path: Path) -> float:
    return sum(f.stat().st_size for f in path.iterdir()) / 1e6


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--n", type=int, default=4000, help="images per style (default 4000)")
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--out", default=None, help="keep the datasets here (default: a temp dir, removed)")
    args = parser.parse_args()

    root = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="vlens_bench_data_"))
    total, images = 0.0, 0
    try:
        for kind, seed in (("syndot", 0), ("synpoly", 1)):
            start = time.perf_counter()
            out = generate_dataset(
                DatasetSpec(kind, args.n, seed, args.image_size), root / kind, args.workers, overwrite=True
            )
            elapsed = time.perf_counter() - start
            total, images = total + elapsed, images + args.n
            print(
                f"{kind:8s} {args.n} images in {elapsed:5.1f} s  ({args.n / elapsed:6.0f} img/s, {disk_mb(out):5.1f} MB)"
            )
        print(
            f"total    {images} images in {total:5.1f} s with {args.workers} workers "
            f"(target <= 30 s); load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"
        )
    finally:
        if not args.out:
            shutil.rmtree(root)


if __name__ == "__main__":
    main()

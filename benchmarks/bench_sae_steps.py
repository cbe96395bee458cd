"""What the SAE trainer's metrics cost per step: training with metrics on every step (what every run
paid before they were computed on logged steps only) against metrics every 25th step, same run.

    python benchmarks/bench_sae_steps.py --threads 1 --repeats 5

Activations already in memory (TensorSource), so the steps alone are timed; the two settings run
interleaved, --repeats times each; medians and the per-repeat ratio.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from vlens.sae.activations import TensorSource
from vlens.sae.settings import SAETraining, TrainRun
from vlens.sae.trainer import train_sae


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--repeats", type=int, default=5, help="interleaved repeats (default 5)")
    parser.add_argument("--d-in", type=int, default=256, help="activation width (default 256)")
    parser.add_argument("--d-sae", type=int, default=2048, help="SAE width (default 2048)")
    parser.add_argument("--steps", type=int, default=200, help="steps per run (default 200)")
    parser.add_argument("--architecture", default="topk", choices=["topk", "standard", "jumprelu"],
                        help="SAE architecture (default topk)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    batch = 1024
    acts = torch.randn(batch * 40, args.d_in, generator=torch.Generator().manual_seed(0))
    training = SAETraining(architecture=args.architecture, d_sae=args.d_sae, k=32, total_tokens=batch * args.steps,
                           batch_size=batch, buffer_size=batch * 8)
    times: dict[int, list[float]] = {1: [], 25: []}
    for _ in range(args.repeats):
        for every in times:
            start = time.perf_counter()
            train_sae(TensorSource(acts, batch * 4), training, TrainRun(log_every=every))
            times[every].append(time.perf_counter() - start)
    ratios = [a / b for a, b in zip(times[1], times[25], strict=True)]
    for every, values in times.items():
        print(f"metrics every {every:>2} steps: median {statistics.median(values):.3f} s for {args.steps} steps")
    print(f"every step / every 25th: median ratio {statistics.median(ratios):.3f} "
          f"(per repeat {min(ratios):.3f}-{max(ratios):.3f}); threads {args.threads}, "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()

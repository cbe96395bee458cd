"""Sharded sweeps: wall time of a layer x head patching sweep on 1 vs 2 gloo processes (CPU).

The script launches `python -m torch.distributed.run --nproc-per-node K` on itself (worker
mode) for each K, interleaved, `--repeats` times. Each worker builds the same random medium
Qwen2.5-VL and pair batch, waits at a barrier, and times `patch_layer_head(..., options=SweepOptions(sharding=...))`
(the work split in units, every rank's plan, the gather), one torch thread per process. Rank 0
reports the time and the result; the script checks that every run gave the same numbers and
reports the scaling efficiency t(1) / (K * t(K)) from the median wall times. On a shared machine
wall times follow the other jobs, so it also reports CPU seconds per rank (`process_time`): the
sharded run's total work over the single run's (duplicated per-rank work shows here) and the
efficiency on idle cores, c(1) / (K * c(busiest rank)).

    python benchmarks/bench_distributed.py [--pairs 16] [--repeats 3] [--config medium] [--out bench_distributed.json]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker(args: argparse.Namespace) -> None:
    """One process of a torchrun launch: time the sharded sweep, rank 0 writes the JSON."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from bench_patching import medium_model

    from vlens.parallel import SweepOptions, from_env
    from vlens.patching import build_pair_batch, make_count_pairs, patch_layer_head

    torch.set_num_threads(args.threads)
    sharding = from_env()
    model = medium_model(args.config)
    batch = build_pair_batch(model, make_count_pairs(args.pairs, seed=0, size=168))
    with torch.no_grad():
        model(batch.clean)  # warm-up
    sharding.barrier()
    start, cpu_start = time.perf_counter(), time.process_time()
    result = patch_layer_head(model, batch, options=SweepOptions(max_batch=args.max_batch, progress=False,
                                                                 sharding=sharding))
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    # one unit per rank: every rank's CPU seconds, gathered in rank order
    cpu_per_rank = sharding.map(range(sharding.world_size), lambda _: cpu, desc="cpu", progress=False)
    if sharding.is_main:
        Path(args.worker_out).write_text(json.dumps({
            "wall_s": wall, "cpu_s": cpu_per_rank, "world_size": sharding.world_size,
            "threads": torch.get_num_threads(),
            "per_pair_logit_diff": result.per_pair_logit_diff.tolist(),
            "per_pair_prediction": result.per_pair_prediction.tolist(),
        }))


def launch(args: argparse.Namespace, nproc: int, threads: int, out: Path) -> dict:
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
               "--master-addr", "127.0.0.1", "--master-port", str(_free_port()), __file__, "--worker",
               "--worker-out", str(out), "--pairs", str(args.pairs), "--config", args.config,
               "--max-batch", str(args.max_batch), "--threads", str(threads)]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONPATH": str(ROOT)}
    subprocess.run(command, check=True, env=env, cwd=ROOT, stdout=subprocess.DEVNULL)
    return json.loads(out.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--config", default="medium", help="a MEDIUM_CONFIGS entry of bench_patching.py")
    parser.add_argument("--max-batch", type=int, default=64)
    parser.add_argument("--nproc", type=int, default=2, help="processes of the sharded run (default 2)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per process (default 1)")
    parser.add_argument("--out", default=None, help="write the numbers as JSON")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--worker-out", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    runs: dict[int, list[dict]] = {1: [], args.nproc: []}
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            for nproc in runs:  # interleaved, so both see the same background load
                runs[nproc].append(launch(args, nproc, args.threads, Path(tmp, f"{nproc}-{repeat}.json")))
                print(f"repeat {repeat}: {nproc} process(es) {runs[nproc][-1]['wall_s']:.2f} s", flush=True)
    load_after = os.getloadavg()
    reference = runs[1][0]
    identical = all(r["per_pair_logit_diff"] == reference["per_pair_logit_diff"]
                    and r["per_pair_prediction"] == reference["per_pair_prediction"] for rs in runs.values() for r in rs)
    t1 = statistics.median(r["wall_s"] for r in runs[1])
    tn = statistics.median(r["wall_s"] for r in runs[args.nproc])
    # CPU seconds do not depend on other jobs: total work of the sharded run vs the single one, and
    # the wall time it would take on idle cores (its busiest rank)
    c1 = statistics.median(r["cpu_s"][0] for r in runs[1])
    cn_total = statistics.median(sum(r["cpu_s"]) for r in runs[args.nproc])
    cn_max = statistics.median(max(r["cpu_s"]) for r in runs[args.nproc])
    summary = {
        "config": args.config, "pairs": args.pairs, "conditions": len(reference["per_pair_logit_diff"]) *
        len(reference["per_pair_logit_diff"][0]), "threads_per_process": args.threads, "nproc": args.nproc,
        "wall_s": {str(k): [r["wall_s"] for r in v] for k, v in runs.items()},
        "median_1": t1, f"median_{args.nproc}": tn, "speedup": t1 / tn, "efficiency": t1 / (args.nproc * tn),
        "cpu_s": {str(k): [r["cpu_s"] for r in v] for k, v in runs.items()},
        "cpu_work_ratio": cn_total / c1, "cpu_efficiency": c1 / (args.nproc * cn_max),
        "identical_results": identical, "load_before": load_before, "load_after": load_after,
        "cpus": os.cpu_count(),
    }
    print(json.dumps(summary, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(summary, indent=1) + "\n")
    if not identical:
        raise SystemExit("the sharded runs did not reproduce the single-process numbers")


if __name__ == "__main__":
    main()

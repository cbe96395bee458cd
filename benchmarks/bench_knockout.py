"""Time the knockout sweep (batched, resumed) against a naive loop, in the same run, on the embedded model.

    python benchmarks/bench_knockout.py [--n 16] [--window 1] [--threads 1] [--repeats 2]

The sweep (`vlens.flow.knockout_sweep`): per chunk of examples one clean pass, then per edge and
window one batched forward resumed from the clean residual entering the window's first layer. The
naive loop: for every example, edge and window, one whole forward of that example alone with the
knockout (plus its clean forward). Both score the same numbers (checked); prints wall and CPU
seconds (best of --repeats, interleaved) and the speed-up.
"""

from __future__ import annotations

import argparse
import time

import torch


def naive(model, batch, edges, windows):
    from vlens.flow import knockout
    from vlens.flow.sweep import answer_scores

    out = {edge: torch.zeros(len(windows), len(batch), dtype=torch.float64) for edge in edges}
    with torch.no_grad():
        for i in range(len(batch)):
            inputs, answers, objects = batch.encode(model, [i])
            p0, _ = answer_scores(model(inputs)[:, -1], answers)
            for edge in edges:
                src, dst = edge.split("->")
                for w, layers in enumerate(windows):
                    with knockout(model, objects if src == "object" else src, dst, layers=layers, inputs=inputs):
                        p, _ = answer_scores(model(inputs)[:, -1], answers)
                    out[edge][w, i] = float(((p - p0) / p0)[0])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=16)
    parser.add_argument("--window", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    import vlens
    from vlens.flow.batch import object_task_batch
    from vlens.flow.sweep import DEFAULT_EDGES, SweepSettings, knockout_sweep

    model = vlens.load()
    print(model.summary())
    batch = object_task_batch("colour", args.n)
    settings = SweepSettings(edges=DEFAULT_EDGES, window=args.window, batch_size=args.batch_size)
    wall: dict[str, list[float]] = {"sweep": [], "naive": []}
    cpu: dict[str, list[float]] = {"sweep": [], "naive": []}
    results = {}
    for _ in range(args.repeats):
        for label in ("sweep", "naive"):
            start, start_cpu = time.perf_counter(), time.process_time()
            if label == "sweep":
                result = knockout_sweep(model, batch, settings=settings, progress=False)
                results[label] = {e: torch.tensor(v, dtype=torch.float64) for e, v in result.prob_change.items()}
                windows = result.windows
            else:
                results[label] = naive(model, batch, DEFAULT_EDGES, windows)
            wall[label].append(time.perf_counter() - start)
            cpu[label].append(time.process_time() - start_cpu)
    worst = max(float((results["sweep"][e] - results["naive"][e]).abs().max()) for e in DEFAULT_EDGES)
    print(f"{args.n} examples, {len(DEFAULT_EDGES)} edges, {len(windows)} windows of {args.window}; "
          f"max |sweep - naive| relative p change: {worst:.2e}")
    for label in ("sweep", "naive"):
        print(f"{label:6s} wall {min(wall[label]):7.2f} s   cpu {min(cpu[label]):7.2f} s")
    print(f"speed-up: wall {min(wall['naive']) / min(wall['sweep']):.1f}x, cpu {min(cpu['naive']) / min(cpu['sweep']):.1f}x")


if __name__ == "__main__":
    main()

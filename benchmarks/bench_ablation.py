"""Time a layer x head ablation sweep on the embedded model's architecture.

    python benchmarks/bench_ablation.py [--trained] [--n 32] [--threads 1]

Compares the resumed, stacked sweep (cached clean residual, heads of a layer batched, the last block
at the answer positions only) against the same sweep with the last block run whole at every position
(the sweep before issue 33) and the plain path (whole model per head with run_with_hooks), checks
they agree, and prints wall and CPU seconds per sweep (the best of --repeats, cases interleaved)
and the speed-ups. Untrained weights by default (same shapes and
cost as `vlens.load()`); --trained uses the embedded model.
"""

from __future__ import annotations

import argparse
import time

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trained", action="store_true", help="use vlens.load() instead of untrained weights")
    parser.add_argument("--task", default="counting")
    parser.add_argument("--n", type=int, default=32, help="evaluation (and reference) examples")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from vlens import HookedVLM, SweepOptions
    from vlens.ablation import build_task_batch, collect_reference, head_ablation_sweep

    if args.trained:
        import vlens

        model = vlens.load()
    else:
        from vlens.recipes.embedded.recipe import build_untrained

        _, processor, hf = build_untrained(seed=0)
        model = HookedVLM.from_hf(hf.eval(), processor=processor)
    print(model.summary())
    evaluation = build_task_batch(model, args.task, args.n)
    reference_set = build_task_batch(model, args.task, args.n, reference=True)
    start = time.perf_counter()
    quiet = SweepOptions(batch_size=args.batch_size, progress=False)
    reference = collect_reference(model, reference_set, "region", options=quiet)
    print(f"reference means over {args.n} examples: {time.perf_counter() - start:.2f} s")
    import vlens.ablation.sweep as sweep_module

    real_supports = sweep_module.supports_last_block_at
    cases = {"resumed+stacked": (True, quiet.replace(heads_per_pass=model.cfg.n_heads), real_supports),
             "last block whole": (True, quiet.replace(heads_per_pass=model.cfg.n_heads), lambda block: False),
             "plain run_with_hooks": (False, quiet, real_supports)}
    timings: dict[str, list[float]] = {label: [] for label in cases}
    cpu: dict[str, list[float]] = {label: [] for label in cases}
    results = {}
    for _ in range(args.repeats):
        for label, (resume, options, supports) in cases.items():
            sweep_module.supports_last_block_at = supports
            start, start_cpu = time.perf_counter(), time.process_time()
            results[label] = head_ablation_sweep(model, evaluation, "mean", reference, resume=resume, options=options)
            timings[label].append(time.perf_counter() - start)
            cpu[label].append(time.process_time() - start_cpu)
    sweep_module.supports_last_block_at = real_supports
    best = {label: min(values) for label, values in timings.items()}
    best_cpu = {label: min(values) for label, values in cpu.items()}
    for label in cases:
        print(f"{label:>22}: {best[label]:.2f} s (CPU {best_cpu[label]:.2f} s) for "
              f"{model.cfg.n_layers * model.cfg.n_heads} heads x {args.n} examples")
    fast = results["resumed+stacked"]
    for label in ("last block whole", "plain run_with_hooks"):
        diff = float((fast.ablated_logprob - results[label].ablated_logprob).abs().max())
        print(f"vs {label}: max |difference| of ablated log-probs {diff:.2e}; speed-up "
              f"{best[label] / best['resumed+stacked']:.2f}x (CPU {best_cpu[label] / best_cpu['resumed+stacked']:.2f}x)")
    import os

    print(f"load average {os.getloadavg()}")

if __name__ == "__main__":
    main()

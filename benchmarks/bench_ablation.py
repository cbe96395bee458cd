"""Time a layer x head ablation sweep on the embedded model's architecture.

    python benchmarks/bench_ablation.py [--trained] [--n 32] [--threads 1]

Compares the resumed, stacked sweep (cached clean residual, heads of a layer batched)
against the plain path (whole model per head with run_with_hooks), checks they agree, and
prints seconds per sweep and the speed-up. Untrained weights by default (same shapes and
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
    timings, results = {}, {}
    for label, (resume, options) in {"resumed+stacked": (True, quiet.replace(heads_per_pass=model.cfg.n_heads)),
                                     "plain run_with_hooks": (False, quiet)}.items():
        start = time.perf_counter()
        results[label] = head_ablation_sweep(model, evaluation, "mean", reference, resume=resume, options=options)
        timings[label] = time.perf_counter() - start
        print(f"{label:>22}: {timings[label]:.2f} s for {model.cfg.n_layers * model.cfg.n_heads} heads "
              f"x {args.n} examples")
    fast, plain = results.values()
    diff = float((fast.ablated_logprob - plain.ablated_logprob).abs().max())
    print(f"max |difference| of ablated log-probs: {diff:.2e}; speed-up "
          f"{timings['plain run_with_hooks'] / timings['resumed+stacked']:.2f}x")


if __name__ == "__main__":
    main()

"""SAEs on the embedded model: what splicing costs (answer loss recovered, counting accuracy at
image / text / all positions) and training throughput, with ratios against the model's own
activation forwards in the same run.

    python benchmarks/bench_sae.py --examples 400 --tokens 60000 --eval 128 --threads 2

Trains one TopK SAE on counting prompts' activations at `--hook` for each of `--train-positions`
(default image and all), splices each at image, text and all positions of held-out prompts, and
times three things: the activation source alone (model forwards, tokens/s), SAE steps alone on
activations already in memory, and end-to-end training. Prints JSON and a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

import vlens
from vlens.data import make_task_sample
from vlens.sae.activations import ActivationOptions, ActivationSource, TensorSource
from vlens.sae.evaluation import evaluate_splice
from vlens.sae.settings import SAETraining
from vlens.sae.trainer import train_sae
from vlens.zoo.image_sizes import embedded_image_size


def counting(n: int, seed: int, size: int) -> list[dict]:
    out = []
    for i in range(n):
        style = "syndot" if i % 2 == 0 else "synpoly"
        image, record = make_task_sample("counting", seed=seed + i, size=size, style=style)
        out.append({"image": image, **record})
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--hook", default="blocks.1.hook_resid_post")
    parser.add_argument("--examples", type=int, default=400)
    parser.add_argument("--tokens", type=int, default=60_000)
    parser.add_argument("--eval", type=int, default=128)
    parser.add_argument("--d-sae", type=int, default=512)
    parser.add_argument("--k", type=int, default=16)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--train-positions", default="image,all")
    parser.add_argument("--size", type=int, default=embedded_image_size(),
                        help="image side in px (default: the embedded model's own size)")
    parser.add_argument("--seed", type=int, default=0,
                        help="another sample: the SAE's seed, training prompts from seed * 100,000 (0-9 stay clear of the held-out prompts)")
    parser.add_argument("--timing-runs", type=int, default=0,
                        help="only time: medians of N interleaved runs of the source and of SAE steps")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model = vlens.load()
    if args.timing_runs:
        timing(model, args)
        return
    train = counting(args.examples, args.seed * 100_000, args.size)
    held_out = counting(args.eval, 1_000_003, args.size)
    report: dict = {"hook": args.hook, "examples": args.examples, "tokens": args.tokens, "eval": args.eval,
                    "d_sae": args.d_sae, "k": args.k, "seed": args.seed, "threads": args.threads, "runs": []}
    for positions in args.train_positions.split(","):
        source = ActivationSource(model, train, ActivationOptions(args.hook, positions=positions, prompts_per_chunk=16))
        start = time.perf_counter()
        chunks = [source.chunk(i).acts for i in range(source.n_chunks)]
        source_s = time.perf_counter() - start
        acts = torch.cat(chunks)
        training = SAETraining(architecture="topk", d_sae=args.d_sae, k=args.k, total_tokens=args.tokens,
                               batch_size=512, buffer_size=8192, lr=1e-3, warmup_steps=50, seed=args.seed)
        start = time.perf_counter()
        steps_only = train_sae(TensorSource(acts, 4096), training, hook_name=args.hook)
        steps_s = time.perf_counter() - start
        start = time.perf_counter()
        trained = train_sae(source, training)
        end_to_end_s = time.perf_counter() - start
        evaluation = evaluate_splice(model, held_out, trained.sae, batch_size=16)
        report["runs"].append({
            "train_positions": positions, "source_tokens": int(acts.shape[0]),
            "source_tokens_per_s": acts.shape[0] / source_s,
            "sae_steps_tokens_per_s": args.tokens / steps_s,
            "end_to_end_tokens_per_s": args.tokens / end_to_end_s,
            "metrics": trained.metrics, "metrics_cached": steps_only.metrics, "splice": evaluation.rows})
    print(json.dumps(report, indent=1))
    print("\n| trained on | spliced at | loss recovered | accuracy (SAE) | clean | zeroed | answer loss clean / SAE / zeroed |")
    print("|---|---|---|---|---|---|---|")
    for run in report["runs"]:
        for row in run["splice"]:
            print(f"| {run['train_positions']} (EV {run['metrics']['explained_variance']:.3f}, L0 "
                  f"{run['metrics']['l0']:.0f}) | {row['positions']} | {row['loss_recovered']:.3f} | "
                  f"{row['accuracy_sae']:.3f} | {row['accuracy_clean']:.3f} | {row['accuracy_zero']:.3f} | "
                  f"{row['loss_clean']:.3f} / {row['loss_sae']:.3f} / {row['loss_zero']:.3f} |")
    print("\n| trained on | source (model forwards) tok/s | SAE steps alone tok/s | end to end tok/s | "
          "end to end / source |")
    print("|---|---|---|---|---|")
    for run in report["runs"]:
        print(f"| {run['train_positions']} | {run['source_tokens_per_s']:.0f} | {run['sae_steps_tokens_per_s']:.0f} | "
              f"{run['end_to_end_tokens_per_s']:.0f} | {run['end_to_end_tokens_per_s'] / run['source_tokens_per_s']:.2f} |")


def timing(model, args) -> None:
    """Tokens/s of the activation source (model forwards stopped after the hook's layer) and of SAE
    steps on activations in memory, medians of interleaved runs; their ratio is what the model costs."""
    import statistics

    train = counting(args.examples, 0, args.size)
    rows = []
    for positions in args.train_positions.split(","):
        source_rates, step_rates = [], []
        for _ in range(args.timing_runs):
            source = ActivationSource(model, train, ActivationOptions(args.hook, positions=positions,
                                                                      prompts_per_chunk=16))
            start = time.perf_counter()
            acts = torch.cat([source.chunk(i).acts for i in range(source.n_chunks)])
            source_rates.append(acts.shape[0] / (time.perf_counter() - start))
            training = SAETraining(architecture="topk", d_sae=args.d_sae, k=args.k, total_tokens=args.tokens,
                                   batch_size=512, buffer_size=8192, lr=1e-3, warmup_steps=50)
            start = time.perf_counter()
            train_sae(TensorSource(acts, 4096), training, hook_name=args.hook)
            step_rates.append(args.tokens / (time.perf_counter() - start))
        source_rate, step_rate = statistics.median(source_rates), statistics.median(step_rates)
        rows.append((positions, int(acts.shape[0]), source_rate, step_rate, 1 / (1 / source_rate + 1 / step_rate)))
    print("| positions | tokens per pass | source tok/s | SAE steps tok/s | both (one pass each) tok/s | "
          "steps / source |")
    print("|---|---|---|---|---|---|")
    for positions, n, source_rate, step_rate, both in rows:
        print(f"| {positions} | {n} | {source_rate:.0f} | {step_rate:.0f} | {both:.0f} | {step_rate / source_rate:.1f} |")


if __name__ == "__main__":
    main()

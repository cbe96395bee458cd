"""Translator (tuned-lens) training on a real 152k vocabulary: one training step and one held-out
evaluation, against the previous implementation, in the same process on the same rows.

The fixture is `vlens.testing.real_vocab` (Qwen's 151,643 BPE ranks, vocabulary 152064, special tokens at
their real ids) with 64-wide layers (`tiny=True`): the vocabulary, not the width, is what the KL
pays for. Residuals are collected at the text positions of task-suite prompts, as
``vlens lens train`` does.

- step: one Adam step's forward + backward over every trained layer on `--batch-size` rows
  (`vlens.lens.kl.TargetTerms`: the final distribution's terms once per row, one logsumexp per
  row and layer) vs the previous step (final logits and two log-softmaxes per layer);
- eval: `layer_kl` on the held-out rows (final distribution once per batch) vs the previous one
  (recomputed per layer).

Interleaved runs: medians, and per-run ratios (median, min, max); the gradients of both steps are compared (max abs difference).

    python benchmarks/bench_lens_training.py                      # 2 layers, 128 rows per step
    python benchmarks/bench_lens_training.py --layers 4 --runs 7
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from vlens import SweepOptions
from vlens.lens.corpus import collect_residuals, task_samples
from vlens.lens.kl import TargetTerms, layer_kl
from vlens.lens.readout import LensReadout
from vlens.lens.translators import Translators
from vlens.testing.real_vocab import real_vocab_model


def reference_kl(target_logits, lens_logits):
    """The previous per-row KL: two log-softmaxes and an elementwise product, per call."""
    log_p = torch.log_softmax(target_logits.float(), dim=-1)
    log_q = torch.log_softmax(lens_logits.float(), dim=-1)
    return (log_p.exp() * (log_p - log_q)).sum(-1)


def reference_step(translators, readout, resid, final, rows, layers):
    h, target = resid[rows], readout.logits(final[rows])
    for layer in layers:
        reference_kl(target, readout.logits(translators(h[:, layer], layer))).mean().backward()


def new_step(translators, targets: TargetTerms, resid, rows, layers):
    h = resid[rows]
    for layer in layers:
        targets.kl(rows, translators(h[:, layer], layer)).mean().backward()


def reference_layer_kl(translators, resid, readout, final, batch_size=512):
    total = torch.zeros(translators.n_layers)
    with torch.no_grad():
        for start in range(0, resid.shape[0], batch_size):
            h = resid[start:start + batch_size]
            target = readout.logits(final[start:start + batch_size])
            for layer in range(translators.n_layers):
                total[layer] += reference_kl(target, readout.logits(translators(h[:, layer], layer))).sum()
    return total / resid.shape[0]


def timed(fn, *args) -> float:
    start = time.perf_counter()
    fn(*args)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--samples", type=int, default=32, help="task-suite prompts whose text positions are the rows")
    parser.add_argument("--batch-size", type=int, default=128, help="rows per step (train_translators' default)")
    parser.add_argument("--val-rows", type=int, default=256)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model = real_vocab_model("qwen2.5-vl-7b", tiny=True, n_layers=args.layers, vision_depth=1)
    resid = collect_residuals(model, task_samples(args.samples, size=56), positions="text",
                              options=SweepOptions(progress=False))
    readout = LensReadout.from_model(model)
    final = resid[:, -1]
    translators = Translators.for_model(model)
    with torch.no_grad():  # a lens part-way through training, not the identity
        translators.A.normal_(0, 0.02, generator=torch.Generator().manual_seed(0))
    layers = range(args.layers - 1)  # the last layer's translator is not trained
    generator = torch.Generator().manual_seed(1)
    report = {"d_vocab": readout.W_U.shape[1], "d_model": readout.d_model, "layers": args.layers,
              "rows": resid.shape[0], "batch_size": args.batch_size, "threads": torch.get_num_threads()}

    # same rows, same lens: the two steps' gradients must agree
    rows = torch.randint(resid.shape[0], (args.batch_size,), generator=generator)
    translators.zero_grad()
    reference_step(translators, readout, resid, final, rows, layers)
    reference_grad = translators.A.grad.clone()
    translators.zero_grad()
    new_step(translators, TargetTerms(final, readout), resid, rows, layers)
    report["max_abs_grad_difference"] = float((translators.A.grad - reference_grad).abs().max())
    report["max_abs_grad"] = float(reference_grad.abs().max())

    times: dict[str, list[float]] = {"reference_step": [], "step": [], "step_warm": [], "reference_eval": [], "eval": []}
    val = resid[: args.val_rows]
    warm = TargetTerms(final, readout)  # a later step of a run: every row's target terms are already there
    warm.fill(torch.arange(resid.shape[0]))
    for run in range(args.runs):
        rows = torch.randint(resid.shape[0], (args.batch_size,), generator=generator)
        targets = TargetTerms(final, readout)  # a fresh run: the step pays for its rows' target terms
        translators.zero_grad()
        times["reference_step"].append(timed(reference_step, translators, readout, resid, final, rows, layers))
        translators.zero_grad()
        times["step"].append(timed(new_step, translators, targets, resid, rows, layers))
        translators.zero_grad()
        times["step_warm"].append(timed(new_step, translators, warm, resid, rows, layers))
        times["reference_eval"].append(timed(reference_layer_kl, translators, val, readout, val[:, -1]))
        times["eval"].append(timed(layer_kl, translators, val, readout))
        print(f"run {run}: " + ", ".join(f"{k} {v[-1]:.2f} s" for k, v in times.items()), flush=True)
    median = {k: statistics.median(v) for k, v in times.items()}
    report["median_s"] = {k: round(v, 3) for k, v in median.items()}
    report["spread_s"] = {k: [round(min(v), 3), round(max(v), 3)] for k, v in times.items()}

    def paired(new: str, old: str) -> list[float]:  # per run: robust to load changing between runs
        ratios = sorted(a / b for a, b in zip(times[new], times[old], strict=True))
        return [round(statistics.median(ratios), 3), round(ratios[0], 3), round(ratios[-1], 3)]

    report["ratios_median_min_max"] = {
        "step_first_visit / reference": paired("step", "reference_step"),
        "step_rows_seen / reference": paired("step_warm", "reference_step"),
        "eval / reference": paired("eval", "reference_eval"),
    }
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()

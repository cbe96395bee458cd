"""What the guards of issue "conclusions that hold" cost and catch, measured in one run.

    python benchmarks/bench_conclusions.py [--threads 1] [--pairs 16]

1. The patch effect's noise floor on the real-vocabulary fixture (Qwen's 152k BPE, digits split)
   with two-digit counts, in float32 and bfloat16: the denominator, the floor, and whether the
   effect is defined (the bf16 grid used to spread from -0.22 to 0.38 on a denominator of -0.004).
2. The cost of the bootstrap intervals every sweep now adds (1,000 resamples of the pairs), as a
   share of the sweep itself: a layer x position sweep on the embedded model.
3. The sampled weights digest of provenance against the exact fingerprint (every element), as a
   ratio, on the embedded model and on a 100M-parameter stack of linear layers.
4. The cost of the HeadLens class stability (200 resamples) against scoring the heads.
Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import time
import warnings

import torch


def _timed(fn):
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def noise_floor(n_pairs: int) -> dict:
    from vlens.data import make_pair
    from vlens.patching import build_pair_batch, examples_from_pairs, patch_layer_region
    from vlens.testing.real_vocab import real_vocab_model

    out = {}
    for dtype in (torch.float32, torch.bfloat16):
        model = real_vocab_model("qwen2.5-vl-7b", dtype=dtype, min_pixels=56 * 56, max_pixels=56 * 56)
        pairs = examples_from_pairs([make_pair(10 + i % 8, 11 + i % 8, seed=i, size=56) for i in range(n_pairs)])
        batch = build_pair_batch(model, pairs)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result = patch_layer_region(model, batch)
        effect = result["patch_effect"]
        out[str(dtype).removeprefix("torch.")] = {
            **result.effect_floor.to_dict(), "effect_finite_cells": int(effect.isfinite().sum()),
            "cells": effect.numel(), "warned": any("noise floor" in str(w.message) for w in caught),
            "logit_diff_range": [float(result["logit_diff"].min()), float(result["logit_diff"].max())]}
    return out


def interval_cost(n_pairs: int) -> dict:
    import vlens
    from vlens.patching import build_pair_batch, make_count_pairs, patch_layer_position

    model = vlens.load()
    batch = build_pair_batch(model, make_count_pairs(n_pairs, seed=0))
    result, total = _timed(lambda: patch_layer_position(model, batch))
    _, bootstrap = _timed(result.bootstrap)
    return {"cells": result["overwrite_rate"].numel(), "pairs": n_pairs, "sweep_s": round(total, 3),
            "bootstrap_s": round(bootstrap, 3), "bootstrap_share_of_sweep": round(bootstrap / total, 4)}


def digest_cost() -> dict:
    import vlens
    from vlens.utils.provenance import weights_digest, weights_fingerprint

    out = {}
    big = torch.nn.Sequential(*[torch.nn.Linear(2048, 2048) for _ in range(24)])  # 100.7M parameters
    for name, module in (("embedded", vlens.load()), ("linear_100M", big)):
        _, exact = _timed(lambda m=module: weights_fingerprint(m))
        _, sampled = _timed(lambda m=module: weights_digest(m))
        out[name] = {"parameters": sum(p.numel() for p in module.parameters()), "fingerprint_s": round(exact, 4),
                     "digest_s": round(sampled, 4), "digest_over_fingerprint": round(sampled / exact, 4)}
    return out


def stability_cost() -> dict:
    import vlens
    from vlens.lens.corpus import task_samples
    from vlens.lens.head_scores import compute_head_scores
    from vlens.lens.taxonomy import classify_heads
    from vlens.parallel.options import SweepOptions

    model = vlens.load()
    options = SweepOptions(progress=False)
    scores, scoring = _timed(lambda: compute_head_scores(model, task_samples(64, seed=0), options=options))
    taxonomy, classifying = _timed(lambda: classify_heads(scores))
    return {"examples": 64, "scoring_s": round(scoring, 3), "stability_s": round(classifying, 3),
            "stability_share_of_scoring": round(classifying / scoring, 4),
            "unstable_heads": int(taxonomy.stability.unstable.sum()), "heads": len(taxonomy.classes)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--pairs", type=int, default=16)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    report = {"noise_floor_real_vocab": noise_floor(args.pairs), "interval_cost": interval_cost(args.pairs),
              "digest_cost": digest_cost(), "stability_cost": stability_cost()}
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()

"""`run_with_cache` with every hook against the plain forward, at ~1,170 tokens on the embedded model.

In one process, interleaved (medians of `--runs`): the forward (`model(inputs)`, SDPA attention),
`run_with_cache(inputs)` (every hook: since issue 33 without ``hook_attn_scores``, the pattern kept),
every hook but the pattern and scores (attention stays on SDPA: what the pattern itself costs) and `run_with_cache(inputs, attn_scores=True)` (every hook with the scores: what the cache held
before, computed as before: scores hooked, then masked, then the softmax). Memory: the bytes of
the cached tensors (each storage counted once) and, with `--rss`, the peak RSS of a child process
running one call of each case (minus that of a child that only loads the model and builds inputs;
at this image size the vision tower's own peak can hide the cache's, so the cached bytes are the
measure).

    python benchmarks/bench_cache_all.py [--runs 5] [--threads 2] [--image-size 952] [--rss]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

import torch

CASES = ("forward", "cache_all", "cache_no_pattern", "cache_all_with_scores")


def _setup(threads: int, image_size: int):
    import vlens
    from vlens.core.devices import configure_resolution
    from vlens.testing import random_image

    torch.set_num_threads(threads)
    model = vlens.load()
    configure_resolution(model.processor, image_size=image_size)
    inputs = model.prepare(images=[random_image(image_size, image_size, 0)], prompts=["How many dots are there?"])
    return model, inputs


def _call(model, inputs, case: str):
    with torch.no_grad():
        if case == "forward":
            return model(inputs), None
        if case == "cache_no_pattern":  # every hook but the pattern / scores: attention stays on SDPA
            return model.run_with_cache(inputs, names_filter=lambda name: not name.endswith(("hook_pattern",
                                                                                          "hook_attn_scores")))
        return model.run_with_cache(inputs, attn_scores=case == "cache_all_with_scores")


def cached_bytes(cache) -> int:
    seen, total = set(), 0
    for tensor in cache.cache_dict.values():
        key = tensor.untyped_storage().data_ptr()
        if key not in seen:
            seen.add(key)
            total += tensor.untyped_storage().nbytes()
    return total


def child(case: str, threads: int, image_size: int) -> None:
    model, inputs = _setup(threads, image_size)
    if case != "setup":
        _call(model, inputs, case)
    print(json.dumps({"peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--image-size", type=int, default=952)
    parser.add_argument("--rss", action="store_true", help="also the peak RSS of one call per case (child processes)")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.threads, args.image_size)
        return
    model, inputs = _setup(args.threads, args.image_size)
    times: dict[str, list[float]] = {case: [] for case in CASES}
    sizes = {}
    for case in CASES:  # warm-up, and the cache sizes
        _, cache = _call(model, inputs, case)
        if cache is not None:
            sizes[case] = cached_bytes(cache) / 2**20
            scores = sum(t.numel() * t.element_size() for n, t in cache.cache_dict.items() if "attn_scores" in n)
            sizes[case + "_scores_part"] = scores / 2**20
        del cache
    for _ in range(args.runs):
        for case in CASES:
            start = time.perf_counter()
            out = _call(model, inputs, case)
            times[case].append(time.perf_counter() - start)
            del out
    med = {case: statistics.median(values) for case, values in times.items()}
    result = {
        "tokens": inputs.seq_len, "threads": args.threads, "runs": args.runs,
        "load_average": os.getloadavg(),
        "median_s": med, "min_s": {case: min(v) for case, v in times.items()},
        "cache_all_over_forward": med["cache_all"] / med["forward"],
        "cache_no_pattern_over_forward": med["cache_no_pattern"] / med["forward"],
        # per interleaved run: each case against the forward of the same run (load shifts between runs)
        "per_run_ratio_median": {case: statistics.median(v / f for v, f in zip(times[case], times["forward"],
                                                                                 strict=True))
                                 for case in CASES if case != "forward"},
        "cache_all_with_scores_over_forward": med["cache_all_with_scores"] / med["forward"],
        "cached_mib": sizes,
        "cache_all_memory_over_with_scores": sizes["cache_all"] / sizes["cache_all_with_scores"],
    }
    print(json.dumps(result, indent=1), flush=True)
    if args.rss:
        rss = {}
        for case in ("setup", *CASES):
            done = subprocess.run([sys.executable, __file__, "--child", case, "--threads", str(args.threads),
                                   "--image-size", str(args.image_size)], capture_output=True, text=True, check=True)
            rss[case] = json.loads(done.stdout.strip().splitlines()[-1])["peak_rss_mib"]
        result["peak_rss_mib"] = rss
        # the vision tower's peak at ~4,700 patches can exceed the cache's: then a case adds nothing above setup
        result["peak_rss_above_setup_mib"] = {case: rss[case] - rss["setup"] for case in CASES}
    print(json.dumps(result, indent=1), flush=True)


if __name__ == "__main__":
    main()

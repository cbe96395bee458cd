"""Forward cost of HookedVLM on mixture-of-experts and hybrid (Gated DeltaNet) decoders, as ratios
against the HF forward of the same weights measured in the same run (medians of interleaved runs).

Per family (Qwen3-VL-MoE, Qwen3.5, Qwen3.5-MoE; one image, ~100 tokens): HF eager (attention eager,
experts eager; and HF's default "grouped_mm" experts), vlens forward, run_with_cache (every hook),
and, for the hybrid decoders, the forward with every `hook_recurrent_state` hooked (the
token-by-token path that materialises the states). Also the expert ablation sweep resumed from the
clean residual against the plain path (one full forward per expert).

    python benchmarks/bench_moe.py [--runs 7] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from vlens import HookedVLM
from vlens.ablation import build_task_batch
from vlens.ablation.experts import collect_expert_reference, expert_ablation_sweep
from vlens.testing import (
    random_image,
    tiny_qwen3_5_model,
    tiny_qwen3_5_moe_model,
    tiny_qwen3_vl_moe_model,
    tiny_qwen3_vl_processor,
)

SHAPE = dict(n_layers=4, d_model=256, n_heads=8, n_kv_heads=2, d_head=32)
FAMILIES = {
    "qwen3_vl_moe": (tiny_qwen3_vl_moe_model, dict(SHAPE, d_mlp=512, n_experts=8, top_k=2, d_expert=128)),
    "qwen3_5": (tiny_qwen3_5_model, dict(SHAPE, d_mlp=512, linear_heads=16, linear_key_heads=8, linear_d_head=32,
                                         linear_d_key=32)),
    "qwen3_5_moe": (tiny_qwen3_5_moe_model, dict(SHAPE, linear_heads=16, linear_key_heads=8, linear_d_head=32,
                                                 linear_d_key=32, n_experts=8, top_k=2, d_expert=128,
                                                 d_shared_expert=128)),
}


def _time(fn) -> float:
    start = time.perf_counter()
    with torch.no_grad():
        fn()
    return time.perf_counter() - start


def median_times(cases: dict, runs: int) -> dict[str, float]:
    for fn in cases.values():  # warm-up
        _time(fn)
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(runs):  # interleaved: every case sees the same machine load
        for name, fn in cases.items():
            times[name].append(_time(fn))
    return {name: statistics.median(values) for name, values in times.items()}


def bench_family(name: str, runs: int) -> dict:
    build, shape = FAMILIES[name]
    extra = {} if name == "qwen3_5" else {"experts_implementation": "eager"}
    hf = build(seed=0, **extra, **shape)
    processor = tiny_qwen3_vl_processor(max_pixels=128 * 128)
    model = HookedVLM.from_hf(hf, processor=processor)
    inputs = model.prepare(images=[random_image(128, 128, 1)], prompts=["How many dots are there? " * 8])
    kwargs = inputs.to_hf_kwargs()
    cases = {"hf_eager": lambda: hf(**kwargs), "vlens_forward": lambda: model(inputs),
             "vlens_cache_all": lambda: model.run_with_cache(inputs)}
    if model.cfg.linear_attention_layers:
        states = [(lambda n: n.endswith("hook_recurrent_state"), lambda s, hook: s)]
        cases["vlens_recurrent_states"] = lambda: model.run_with_hooks(inputs, fwd_hooks=states)
    grouped = None
    if model.cfg.moe_layers:
        grouped = build(seed=0, experts_implementation="grouped_mm", **shape)
        cases["hf_grouped_mm"] = lambda: grouped(**kwargs)
    times = median_times(cases, runs)
    out = {"tokens": inputs.seq_len, "median_s": {k: round(v, 5) for k, v in times.items()},
           "ratio_vs_hf_eager": {k: round(v / times["hf_eager"], 3) for k, v in times.items()}}
    if model.cfg.moe_layers:
        out["expert_sweep"] = bench_expert_sweep(model)
    return out


def bench_expert_sweep(model) -> dict:
    task = build_task_batch(model, "counting", 4, image_size=64)
    reference = collect_expert_reference(model, build_task_batch(model, "counting", 4, image_size=64,
                                                                 reference=True), progress=False)
    times = median_times({
        "resume": lambda: expert_ablation_sweep(model, task, "mean", reference, batch_size=4, progress=False),
        "plain": lambda: expert_ablation_sweep(model, task, "mean", reference, batch_size=4, resume=False,
                                               progress=False),
    }, 3)
    return {"median_s": {k: round(v, 4) for k, v in times.items()},
            "plain_over_resume": round(times["plain"] / times["resume"], 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    results = {name: bench_family(name, args.runs) for name in FAMILIES}
    print(json.dumps({"threads": args.threads, "runs": args.runs, "families": results}, indent=1))


if __name__ == "__main__":
    main()

"""Forward-pass overhead of HookedVLM against HF, measured in one process.

Ratios (medians of interleaved runs) of: plain forward, run_with_cache (all hooks) and
run_with_cache (hook_z only), against HF eager and HF sdpa forwards of the same weights; plus
the peak RSS of `from_pretrained` on a ~200 MB random checkpoint relative to its size.

    python benchmarks/bench_forward.py [--runs 10] [--threads 2] [--skip-rss]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch

from vlens import HookedVLM
from vlens.testing import random_image, tiny_hf_model, tiny_qwen_processor, word_level_tokenizer

CONFIGS = {
    # name: (config kwargs, image side in px, images per prompt)
    "tiny": (dict(n_layers=2, d_model=64, n_heads=4, n_kv_heads=2, d_mlp=96), 112, 1),
    # ~8 layers, d_model 512, ~300 image tokens (2 images of 336x336 px -> 2 * 144 merged tokens)
    "medium": (dict(n_layers=8, d_model=512, n_heads=8, n_kv_heads=2, d_mlp=1536, vision_depth=2,
                    vision_width=128), 336, 2),
}


def _time(fn) -> float:
    start = time.perf_counter()
    with torch.no_grad():
        fn()
    return time.perf_counter() - start


def bench_config(name: str, runs: int) -> dict:
    kwargs, side, n_images = CONFIGS[name]
    hf_eager = tiny_hf_model("qwen2_5_vl", attn_implementation="eager", **kwargs)
    hf_sdpa = tiny_hf_model("qwen2_5_vl", attn_implementation="sdpa", **kwargs)
    processor = tiny_qwen_processor(max_pixels=side * side)
    model = HookedVLM.from_hf(hf_sdpa, processor=processor)  # its parameters are hf_sdpa's
    images = [[random_image(side, side, seed=i) for i in range(n_images)]]
    inputs = model.prepare(images=images, prompts=["How many dots are there?"])
    hf_kwargs = inputs.to_hf_kwargs()
    cases = {
        "hf_eager": lambda: hf_eager(**hf_kwargs),
        "hf_sdpa": lambda: hf_sdpa(**hf_kwargs),
        "vlens_forward": lambda: model(inputs),
        "vlens_cache_all": lambda: model.run_with_cache(inputs),
        "vlens_cache_z": lambda: model.run_with_cache(inputs, names_filter=lambda n: n.endswith("hook_z")),
    }
    for fn in cases.values():  # warm-up
        _time(fn)
    times = {k: [] for k in cases}
    for _ in range(runs):  # interleaved so drifts hit every case alike
        for key, fn in cases.items():
            times[key].append(_time(fn))
    med = {k: statistics.median(v) for k, v in times.items()}
    return {
        "config": name,
        "seq_len": inputs.seq_len,
        "image_tokens": int(sum(len(r) for r in inputs.regions.image)),
        "median_s": med,
        "forward_vs_hf_sdpa": med["vlens_forward"] / med["hf_sdpa"],
        "cache_z_vs_hf_eager": med["vlens_cache_z"] / med["hf_eager"],
        "cache_all_vs_hf_eager": med["vlens_cache_all"] / med["hf_eager"],
    }


def peak_rss_kb() -> int:
    """VmHWM of this process (ru_maxrss is inherited across fork/exec on Linux, VmHWM is not)."""
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("VmHWM"))


def _rss_child(folder: str) -> None:
    model = HookedVLM.from_pretrained(folder, load_processor=False)
    with torch.no_grad():  # touch every weight so memory-mapped pages count as resident
        total = sum(float(p.float().abs().sum()) for p in model.hf_model.parameters())
    assert total > 0
    print(json.dumps({"peak_rss_kb": peak_rss_kb()}))


def bench_rss() -> dict:
    """Peak RSS of from_pretrained on a ~200 MB checkpoint minus the baseline of an import-only process."""
    tokenizer = word_level_tokenizer()
    hf = tiny_hf_model("qwen2_5_vl", n_layers=8, d_model=1024, n_heads=8, n_kv_heads=4, d_mlp=2816,
                       vocab_size=len(tokenizer) + 8000, vision_depth=2, vision_width=256)
    with tempfile.TemporaryDirectory() as folder:
        hf.save_pretrained(folder)
        del hf
        gc.collect()
        size = os.path.getsize(os.path.join(folder, "model.safetensors"))
        here = os.path.dirname(os.path.abspath(__file__))
        code = (f"import json, sys; sys.path.insert(0, {here!r}); import bench_forward, vlens.core.model; "
                "print(json.dumps({'peak_rss_kb': bench_forward.peak_rss_kb()}))")
        base = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                         check=True).stdout.strip().splitlines()[-1])["peak_rss_kb"]
        out = subprocess.run([sys.executable, __file__, "--rss-child", folder], capture_output=True, text=True,
                             check=True)
        peak = json.loads(out.stdout.strip().splitlines()[-1])["peak_rss_kb"]
    added = (peak - base) * 1024
    return {"checkpoint_bytes": size, "rss_added_bytes": added, "rss_added_vs_checkpoint": added / size}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--skip-rss", action="store_true")
    parser.add_argument("--rss-child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.rss_child:
        _rss_child(args.rss_child)
        return
    results = [bench_config(name, args.runs) for name in CONFIGS]
    if not args.skip_rss:
        results.append(bench_rss())
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()

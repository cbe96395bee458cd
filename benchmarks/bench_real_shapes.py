"""vlens against HF at real widths: the Qwen2.5-VL-7B-Instruct-wide fixture (vlens.testing.real_vocab).

Exact 7B widths (d_model 3584, 28 heads / 4 KV heads, d_mlp 18944, vocab 152064, vision
1280 wide) with the depths cut to --layers / --vision-depth, random weights in --dtype, the
real Qwen vocabulary, one --image px image and a prompt padded with text to --tokens tokens.
Medians of interleaved runs, ratios against HF measured in the same process on the same
weights:

- forward: vlens `model(inputs, return_type="resid")` / HF sdpa `hf_model.model(...)`;
- cache z: vlens `run_with_cache(names_filter=hook_z)` / HF eager `hf_model.model(...)`.

Both sides stop after the final norm: the unembedding (d_model x 152064) is the same
`nn.Linear` in both and, at 1,000 positions in bf16 on a CPU, costs more than the rest.
Memory: the bytes `run_with_cache` holds per decoder layer with every hook and with `hook_z`
only, measured at this length, then computed for --paper-tokens tokens and --paper-layers
layers (activation shapes scale with the sequence; attention scores / patterns with its square).

    python benchmarks/bench_real_shapes.py                          # 1 layer, 448 px, 1,000 tokens, bf16, CPU
    python benchmarks/bench_real_shapes.py --tokens 400 --runs 2     # what a shared 2-core CPU affords
    python benchmarks/bench_real_shapes.py --device cuda --layers 28 --vision-depth 32   # full 7B shape on a GPU
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from vlens.core.devices import resolve_device, resolve_dtype
from vlens.core.model import HookedVLM
from vlens.testing import random_image
from vlens.testing.real_vocab import real_vocab_hf_model, real_vocab_processor

FILLER = " Count every object in the picture carefully, one by one, and answer with a number."


def build(args) -> tuple[HookedVLM, object]:
    dtype, device = resolve_dtype(args.dtype, args.device), resolve_device(args.device)
    hf_model = real_vocab_hf_model("qwen2.5-vl-7b", tiny=False, n_layers=args.layers, vision_depth=args.vision_depth,
                                   dtype=dtype, attn_implementation="sdpa")
    processor = real_vocab_processor("qwen2_5_vl", min_pixels=args.image * args.image,
                                     max_pixels=args.image * args.image)
    model = HookedVLM.from_hf(hf_model, processor=processor).to(device)
    image = random_image(args.image, args.image, seed=0)
    question = "How many dots are there?"
    inputs = model.prepare(images=[image], prompts=[question])
    while inputs.seq_len < args.tokens:  # pad the question with text up to the target length
        question = FILLER + question
        inputs = model.prepare(images=[image], prompts=[question])
    return model, inputs


def timed(fn) -> float:
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    start = time.perf_counter()
    with torch.no_grad():
        fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter() - start


def set_hf_attention(hf_model, kind: str) -> None:
    for config in (hf_model.config, getattr(hf_model.config, "text_config", None)):
        if config is not None:
            config._attn_implementation = kind


def cache_bytes(model, inputs, names_filter) -> dict[str, int]:
    with torch.no_grad():
        _, cache = model.run_with_cache(inputs, names_filter=names_filter, return_type="resid")
    return {name: t.numel() * t.element_size() for name, t in cache.items()}


def scale(name: str, nbytes: int, factor: float) -> float:
    """Bytes of one cached activation at `factor` x the sequence length (vision hooks: same image)."""
    if name.startswith("vision."):
        return nbytes
    if name.endswith(("hook_attn_scores", "hook_pattern")):
        return nbytes * factor * factor
    return nbytes * factor


def memory(model, inputs, paper_tokens: int, paper_layers: int) -> dict:
    out = {}
    for label, names_filter in (("all_hooks", None), ("hook_z_only", lambda n: n.endswith("attn.hook_z"))):
        sizes = cache_bytes(model, inputs, names_filter)
        per_layer = {layer: sum(b for n, b in sizes.items() if n.startswith(f"blocks.{layer}."))
                     for layer in range(model.cfg.n_layers)}
        other = sum(b for n, b in sizes.items() if not n.startswith("blocks."))
        factor = paper_tokens / inputs.seq_len
        layer0 = {n: b for n, b in sizes.items() if n.startswith("blocks.0.")}
        paper_layer = sum(scale(n, b, factor) for n, b in layer0.items())
        paper_other = sum(scale(n, b, factor) for n, b in sizes.items() if not n.startswith("blocks."))
        out[label] = {
            "measured_tokens": inputs.seq_len, "per_layer_MiB": round(per_layer[0] / 2**20, 1),
            "outside_layers_MiB": round(other / 2**20, 1),
            f"per_layer_MiB_at_{paper_tokens}_tokens": round(paper_layer / 2**20, 1),
            f"total_GiB_{paper_layers}_layers_{paper_tokens}_tokens":
                round((paper_layer * paper_layers + paper_other) / 2**30, 2),
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=1)
    parser.add_argument("--vision-depth", type=int, default=1)
    parser.add_argument("--image", type=int, default=448, help="image side in px (448 -> 256 merged image tokens)")
    parser.add_argument("--tokens", type=int, default=1000, help="prompt length (text added to reach it)")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--runs", type=int, default=3, help="timed runs per case (interleaved; median)")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--paper-tokens", type=int, default=1000)
    parser.add_argument("--paper-layers", type=int, default=28)
    parser.add_argument("--skip-timing", action="store_true")
    parser.add_argument("--skip-memory", action="store_true")
    parser.add_argument("--cases", default="hf_sdpa,vlens_forward,hf_eager,vlens_cache_z",
                        help="which timed cases to run (a ratio is reported when both of its cases ran)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    start = time.perf_counter()
    model, inputs = build(args)
    hf_kwargs = inputs.to_hf_kwargs()
    report = {"shape": "qwen2.5-vl-7b widths", "layers": args.layers, "vision_depth": args.vision_depth,
              "dtype": str(model.cfg.dtype), "device": str(model.cfg.device), "tokens": inputs.seq_len,
              "image_tokens": len(inputs.regions.image[0]), "build_s": round(time.perf_counter() - start, 1),
              "threads": torch.get_num_threads()}
    print(json.dumps(report), flush=True)
    if not args.skip_memory:
        report["memory"] = memory(model, inputs, args.paper_tokens, args.paper_layers)
        print(json.dumps(report["memory"]), flush=True)
    if not args.skip_timing:
        hf_base = model.hf_model.model

        def hf(kind: str):
            set_hf_attention(model.hf_model, kind)
            return hf_base(**hf_kwargs)

        cases = {
            "hf_sdpa": lambda: hf("sdpa"),
            "vlens_forward": lambda: model(inputs, return_type="resid"),
            "hf_eager": lambda: hf("eager"),
            "vlens_cache_z": lambda: model.run_with_cache(inputs, names_filter=lambda n: n.endswith("attn.hook_z"),
                                                          return_type="resid"),
        }
        cases = {name: fn for name, fn in cases.items() if name in args.cases.split(",")}
        times: dict[str, list[float]] = {name: [] for name in cases}
        for run in range(args.runs):
            for name, fn in cases.items():
                times[name].append(timed(fn))
                print(f"run {run} {name}: {times[name][-1]:.1f} s", flush=True)
        median = {name: statistics.median(ts) for name, ts in times.items()}
        report["median_s"] = {k: round(v, 2) for k, v in median.items()}
        pairs = {"forward_vs_hf_sdpa": ("vlens_forward", "hf_sdpa"), "cache_z_vs_hf_eager": ("vlens_cache_z", "hf_eager")}
        report["ratios"] = {name: round(median[a] / median[b], 3) for name, (a, b) in pairs.items()
                            if a in median and b in median}
        report["spread"] = {name: [round(min(ts), 2), round(max(ts), 2)] for name, ts in times.items()}
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()

"""Patching benchmarks and findings.

1. Speed: the full layer x head `hook_z` sweep, naive loop (one `run_with_hooks` forward per
   head) vs the fast path (vision once, resume from the cached clean residual, conditions
   batched), on the embedded model and on a medium random config; also checks they agree.
2. AtP: Spearman correlation of attribution patching (hook_z) with the exact head sweep.
3. Findings on the embedded model: overwrite rate of image-token / final-position patches of
   `resid_pre` across layers, and the logit lens at the final position.

    python benchmarks/bench_patching.py [--pairs 8] [--finding-pairs 64] [--threads 1] [--out bench_patching.json]
        [--figures DIR] [--skip-embedded] [--skip-medium] [--seed 1] [--skip-speed]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from vlens import HookedVLM, SweepOptions
from vlens.patching import (
    attribution_patching,
    build_pair_batch,
    make_count_pairs,
    patch_layer_head,
    patch_layer_position,
    patch_layer_region,
    spearman,
)
from vlens.testing import tiny_hf_model, tiny_qwen_processor
from vlens.viz.html import write_figure_html
from vlens.zoo.image_sizes import render_size

QUIET = SweepOptions(progress=False)

# Random medium configs: an 8-layer x 8-head decoder (d_model 256), 168 px images -> 144 patches -> 36 tokens.
# "medium" keeps Qwen2.5-VL-7B's proportions of vision tower to decoder (32 vision blocks of width
# 1280 vs 28 decoder layers of width 3584: about as deep, ~1/3 as wide); "medium-light-vision" has a
# token vision tower, the case where only resuming and batching can help.
MEDIUM_CONFIGS = {
    "medium": dict(
        n_layers=8, d_model=256, n_heads=8, n_kv_heads=2, d_mlp=768, vision_depth=8, vision_width=96
    ),
    "medium-light-vision": dict(
        n_layers=8, d_model=256, n_heads=8, n_kv_heads=2, d_mlp=768, vision_depth=2, vision_width=64
    ),
}


def medium_model(name: str = "medium") -> HookedVLM:
    """A random Qwen2.5-VL of `MEDIUM_CONFIGS[name]`."""
    return HookedVLM.from_hf(
        tiny_hf_model("qwen2_5_vl", **MEDIUM_CONFIGS[name]), processor=tiny_qwen_processor(max_pixels=168 * 168)
    )


def embedded_architecture_model(seed: int = 0) -> HookedVLM:
    """The shipped embedded model's config (layers, widths, rotary settings) and processor (its input size) with
    random weights (speed proxy)."""
    from transformers import AutoConfig, Qwen2_5_VLForConditionalGeneration

    from vlens.zoo import WEIGHTS_FOLDER
    from vlens.zoo.processor import load_processor

    torch.manual_seed(seed)
    hf = Qwen2_5_VLForConditionalGeneration(AutoConfig.from_pretrained(WEIGHTS_FOLDER)).eval()
    return HookedVLM.from_hf(hf, processor=load_processor(WEIGHTS_FOLDER))


def _timed(fn, repeats: int):
    """Best of `repeats` (wall seconds, CPU seconds of this process) and the last output.

    CPU time is the steadier number on a shared machine: other jobs change wall time, not it.
    """
    best_wall, best_cpu, out = float("inf"), float("inf"), None
    for _ in range(repeats):
        wall, cpu = time.perf_counter(), time.process_time()
        out = fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        best_wall = min(best_wall, time.perf_counter() - wall)
        best_cpu = min(best_cpu, time.process_time() - cpu)
    return (best_wall, best_cpu), out


def bench_sweep(model: HookedVLM, n_pairs: int, repeats: int, max_batch: int, sweep=patch_layer_head) -> dict:
    """Naive vs fast timing of one full sweep (default: every layer x head hook_z) and their max difference."""
    size = render_size(model)  # the size the model pins (the embedded model: its training size), else 168 px
    batch = build_pair_batch(model, make_count_pairs(n_pairs, seed=0, size=size))
    options = SweepOptions(max_batch=max_batch, progress=False)
    sweep(model, batch, options=options)  # warm-up
    t_naive, naive = _timed(lambda: sweep(model, batch, options=QUIET.replace(implementation="naive")), repeats)
    t_fast, fast = _timed(lambda: sweep(model, batch, options=options), repeats)
    diff = float((fast.per_pair_logit_diff - naive.per_pair_logit_diff).abs().max())
    return {
        "sweep": sweep.__name__,
        "n_layers": model.cfg.n_layers,
        "n_heads": model.cfg.n_heads,
        "d_model": model.cfg.d_model,
        "device": str(model.cfg.device),
        "n_pairs": n_pairs,
        "image_size": size,
        "seq_len": batch.seq_len,
        "conditions": naive.per_pair_logit_diff.shape[:2].numel(),
        "naive_wall_s": t_naive[0],
        "fast_wall_s": t_fast[0],
        "speedup_wall": t_naive[0] / t_fast[0],
        "naive_cpu_s": t_naive[1],
        "fast_cpu_s": t_fast[1],
        "speedup_cpu": t_naive[1] / t_fast[1],
        "max_abs_diff_logit_diff": diff,
    }


def findings(model: HookedVLM, n_pairs: int, figures: Path | None, seed: int = 1) -> dict:
    """Overwrite rates of image / final patches per layer, AtP vs exact heads, logit lens.

    `seed` draws the pairs (`make_count_pairs`) and the logit-lens images (seeds from 10,000 x seed):
    a second seed is an independent sample of both, to tell a stable finding from a sampling accident.
    """
    from vlens.lens.logit_lens import logit_lens_records

    size = render_size(model)  # the model's own input size: images drawn at another are off its distribution
    batch = build_pair_batch(model, make_count_pairs(n_pairs, seed=seed, size=size))
    region = patch_layer_region(model, batch, component="resid_pre", options=QUIET)
    heads = patch_layer_head(model, batch, options=QUIET)
    exact = heads.metrics["logit_diff"] - heads.baseline.clean_logit_diff.mean()
    atp = attribution_patching(model, batch, options=QUIET)
    atp.exact_z = exact
    positions = patch_layer_position(model, batch, options=QUIET)
    exact_pos = positions.metrics["logit_diff"] - positions.baseline.clean_logit_diff.mean()
    from vlens.data import make_task_sample

    samples = [
        make_task_sample("counting", seed=10_000 * seed + i, size=size, style="syndot") for i in range(n_pairs)
    ]
    lens = logit_lens_records(model, [{**r, "image": im} for im, r in samples],
                              options=QUIET.replace(batch_size=16))
    others = {c: patch_layer_region(model, batch, component=c, options=QUIET) for c in ("attn_out", "mlp_out")}
    out = {
        "n_pairs": n_pairs,
        "seed": seed,
        "image_size": size,
        "seq_len": batch.seq_len,
        "components_overwrite_rate": {c: r.metrics["overwrite_rate"].tolist() for c, r in others.items()},
        "components_patch_effect": {c: r.metrics["patch_effect"].tolist() for c, r in others.items()},
        "clean_accuracy": float(region.baseline.clean_correct.float().mean()),
        "corrupt_accuracy": float(region.baseline.corrupt_correct.float().mean()),
        "layer_region": {
            name: region.metrics[name].tolist()
            for name in ("overwrite_rate", "flip_away_rate", "logit_diff", "patch_effect")
        },
        "regions": region.cells,
        "head_overwrite_rate": heads.metrics["overwrite_rate"].tolist(),
        "head_delta_logit_diff": exact.tolist(),
        "atp_z": atp.z.tolist(),
        "atp_spearman_vs_exact": atp.spearman_z,
        "atp_resid_spearman_vs_exact_positions": spearman(atp.resid_pre, exact_pos),
        "layer_pos_overwrite_rate": positions.metrics["overwrite_rate"].tolist(),
        "layer_pos_tokens": positions.tokens,
        "logit_lens": {
            k: v
            for k, v in lens.to_dict().items()
            if k in ("mean_probability", "median_rank", "top1_accuracy", "n_examples")
        },
    }
    if figures is not None:
        figures.mkdir(parents=True, exist_ok=True)
        # offline HTML (plotly.js inlined, 1.5 MB each: not committed) and a PNG (committed: shows on a code host)
        for name, figure in (("vap_layer_region", region.plot("overwrite_rate")),
                             ("vap_layer_head", heads.plot("overwrite_rate")),
                             ("vap_image_grid", positions.plot_image_grid("patch_effect")),
                             ("atp_z", atp.plot("z")), ("logit_lens", lens.plot())):
            write_figure_html(figure, figures / f"{name}.html")
            figure.write_image(figures / f"{name}.png", width=900, height=500)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", type=int, default=8, help="pairs in the speed benchmark")
    parser.add_argument(
        "--finding-pairs", type=int, default=64, help="pairs for the findings on the embedded model"
    )
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--max-batch", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=1, help="seed of the findings' pairs and logit-lens images")
    parser.add_argument(
        "--skip-speed", action="store_true", help="findings only (no speed sweeps on the embedded model)"
    )
    parser.add_argument("--out", default=None, help="write all numbers as JSON")
    parser.add_argument("--figures", default=None, help="folder for HTML figures of the findings")
    parser.add_argument("--skip-embedded", action="store_true")
    parser.add_argument("--skip-medium", action="store_true")
    parser.add_argument(
        "--random-embedded",
        action="store_true",
        help="speed only: the embedded architecture with random weights (no trained weights needed)",
    )
    parser.add_argument("--device", default=None, help="e.g. cuda (default: CPU)")
    parser.add_argument("--model", default=None, help="a model folder instead of the embedded model")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    results: dict = {"threads": args.threads}
    device = args.device
    if args.random_embedded:
        model = embedded_architecture_model().to(device or "cpu")
        results["embedded_architecture_random_speed"] = bench_sweep(
            model, args.pairs, args.repeats, args.max_batch
        )
        print(
            "embedded architecture (random) head sweep:",
            json.dumps(results["embedded_architecture_random_speed"]),
        )
        results["embedded_architecture_random_layer_pos"] = bench_sweep(
            model, args.pairs, 1, args.max_batch, patch_layer_position
        )
        print(
            "embedded architecture (random) layer-pos:",
            json.dumps(results["embedded_architecture_random_layer_pos"]),
        )
    elif not args.skip_embedded:
        import vlens

        model = (
            vlens.HookedVLM.from_pretrained(args.model, device=device)
            if args.model
            else vlens.load(device=device)
        )
        if not args.skip_speed:
            results["embedded_speed"] = bench_sweep(model, args.pairs, args.repeats, args.max_batch)
            print("embedded head sweep:", json.dumps(results["embedded_speed"]))
            results["embedded_layer_pos_speed"] = bench_sweep(
                model, args.pairs, 1, args.max_batch, patch_layer_position
            )
            print("embedded layer-pos sweep:", json.dumps(results["embedded_layer_pos_speed"]))
        if args.finding_pairs > 0:
            results["embedded_findings"] = findings(
                model, args.finding_pairs, Path(args.figures) if args.figures else None, seed=args.seed
            )
            print("embedded findings:", json.dumps(results["embedded_findings"], indent=1))
    if not args.skip_medium:
        for name in MEDIUM_CONFIGS:
            model = medium_model(name).to(device or "cpu")
            results[f"{name}_speed"] = bench_sweep(model, args.pairs, args.repeats, args.max_batch)
            print(f"{name} head sweep:", json.dumps(results[f"{name}_speed"]))
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()

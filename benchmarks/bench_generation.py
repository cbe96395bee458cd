"""Time generation with caching and per-token image attribution, as ratios within one run, on the embedded model.

    python benchmarks/bench_generation.py [--new 16] [--size PX] [--threads 1] [--repeats 3] [--wide]
        [--agreement-images 8 [--against FOLDER]]

--wide: a random Qwen2.5-VL of 8 layers, d_model 512 (8 heads, 2 KV heads, MLP 1376) instead of the
embedded model, so that a forward costs more than its fixed overheads (its continuation: the generated
tokens with special ids replaced by a plain word, since a random model may emit placeholders).

Part 1, generation (greedy, --new tokens, no early stop, best of --repeats, interleaved):
  plain `generate`; `generate(return_cache=True)` caching every hook's residual stream
  (`hook_resid_post`) and caching every hook (names_filter None); one forward over prompt + output
  (what the cache equals: `continuation_inputs`), plain and with `run_with_cache` of every hook.
Part 2, per-token attribution over the image (`vlens.generation_attribution`), in forward-equivalents
  (its wall time over one forward over prompt + output): the estimates (gradient x activation and
  attribution patching: one forward, one backward per generated token), exact patching of every image
  token (one forward row per token), and the whole `attribute_generation` (+ logit lens, baseline).
  Also prints each estimate's agreement with exact patching (mean baseline); with --agreement-images N, over N
  images, and with --against FOLDER (other weights of the same model, e.g. a superseded embedded model) the same
  images' agreement on those weights and the paired per-image differences (this model minus FOLDER's).
"""

from __future__ import annotations

import argparse
import os
import time

import torch


def best(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--new", type=int, default=16)
    parser.add_argument("--size", type=int, default=None,
                        help="image side in px (default: the size each model pins, --against's model too)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--wide", action="store_true")
    parser.add_argument("--agreement-images", type=int, default=1,
                        help="also the agreement over this many images (make_pair seeds 0..N-1): mean, sd, range")
    parser.add_argument("--against", default=None,
                        help="a model folder: its agreement on the same images, paired with this model's")
    args = parser.parse_args()
    if args.against and args.agreement_images < 2:
        parser.error("--against compares the agreement over images: give --agreement-images 2 or more")
    torch.set_num_threads(args.threads)

    import vlens
    from vlens.core.generation import continuation_inputs
    from vlens.data import make_pair
    from vlens.generation_attribution import GenerationAttributionSettings, attribute_generation

    # the exact-patching step alone, timed apart from the rest (module-private since e80c6db: one caller)
    from vlens.generation_attribution.attribute import _exact_patches as exact_patches
    from vlens.generation_attribution.attribute import baseline_state, image_tokens
    from vlens.zoo.image_sizes import render_size

    if args.wide:
        from vlens.testing import tiny_hf_model, tiny_qwen_processor

        hf = tiny_hf_model(n_layers=8, d_model=512, n_heads=8, n_kv_heads=2, d_mlp=1376)
        model = vlens.HookedVLM.from_hf(hf, processor=tiny_qwen_processor())
    else:
        model = vlens.load()
    size = render_size(model, args.size)
    print(model.summary(), f"image size {size} px, threads {torch.get_num_threads()}, load average {os.getloadavg()[0]:.1f}")
    pair = make_pair(n_clean=3, n_corrupt=5, seed=0, size=size)
    inputs = model.prepare(images=[pair.clean_image], prompts=["Describe the image."])
    out = model.generate(inputs, max_new_tokens=args.new, stop_at_eos=False, return_type="output")
    special = special_ids(model)
    new = torch.where(torch.isin(out.tokens[0], special), model.to_single_token("red"), out.tokens[0])
    full = continuation_inputs(model, inputs, new[None])
    print(f"prompt {inputs.seq_len} tokens ({len(inputs.regions.image[0])} image tokens), {args.new} new tokens")

    resid = lambda name: name.endswith("hook_resid_post")  # noqa: E731
    runs = {
        "generate": lambda: model.generate(inputs, max_new_tokens=args.new, stop_at_eos=False, return_type="output"),
        "generate(return_cache, hook_resid_post)": lambda: model.generate(
            inputs, max_new_tokens=args.new, stop_at_eos=False, return_cache=True, names_filter=resid),
        "generate(return_cache, every hook)": lambda: model.generate(
            inputs, max_new_tokens=args.new, stop_at_eos=False, return_cache=True),
        "forward over prompt + output": lambda: model(full),
        "run_with_cache over prompt + output, every hook": lambda: model.run_with_cache(full),
    }
    times: dict[str, list[float]] = {name: [] for name in runs}
    with torch.no_grad():
        for _ in range(args.repeats):  # interleaved: the machine's load hits every path alike
            for name, fn in runs.items():
                times[name].append(best(fn, 1))
    base = min(times["generate"])
    print("\n| path | wall (best) | / plain generate |\n|---|---|---|")
    for name, values in times.items():
        print(f"| {name} | {min(values) * 1e3:.1f} ms | {min(values) / base:.2f} |")

    predicting = torch.arange(inputs.seq_len - 1, inputs.seq_len - 1 + len(new))
    with torch.no_grad():
        state = model.start_run(full)
        base_state = baseline_state(model, state, full, "mean", new)
    tokens = image_tokens(full, 1)
    sets = [image.positions[r] for image in tokens for r in image.regions]
    estimates = GenerationAttributionSettings(exact=False, lens=False)
    timed = {
        "forward over prompt + output": lambda: model(full),
        "estimates (gradient x activation + attribution patching)": lambda: attribute_generation(
            model, inputs, estimates, continuation=new, progress=False),
        f"exact patching of every image token ({len(sets)} rows, 8 per forward)": lambda: exact_patches(
            model, state, base_state, full.input_ids, sets, predicting, new, "logprob", 8, False),
        "attribute_generation (estimates + exact + lens)": lambda: attribute_generation(
            model, inputs, GenerationAttributionSettings(), continuation=new, progress=False),
    }
    cost: dict[str, list[float]] = {name: [] for name in timed}
    for _ in range(args.repeats):
        for name, fn in timed.items():
            with torch.no_grad() if name.startswith(("forward", "exact")) else torch.enable_grad():
                cost[name].append(best(fn, 1))
    unit = min(cost["forward over prompt + output"])
    print("\n| part | wall (best) | forward-equivalents |\n|---|---|---|")
    for name, values in cost.items():
        print(f"| {name} | {min(values) * 1e3:.1f} ms | {min(values) / unit:.1f} |")
    result = attribute_generation(model, inputs, GenerationAttributionSettings(), continuation=new, progress=False)
    for method, values in result.agreement().items():
        print(f"{method} vs exact (mean baseline, per token across {len(sets)} tokens): pearson mean "
              f"{values['pearson_mean']:.3f}, spearman mean {values['spearman_mean']:.3f}, "
              f"pearson over all {values['pearson_all']:.3f}")
    if args.agreement_images > 1:
        ours = agreement_over_images(model, args, special)
        if args.against:
            other = vlens.HookedVLM.from_pretrained(args.against, device="cpu", dtype=torch.float32)
            other.eval()
            print(f"\n{args.against} (image size {render_size(other, args.size)} px):")
            paired_differences(ours, agreement_over_images(other, args, special_ids(other)), args.against)


def special_ids(model) -> torch.Tensor:
    """Token ids a continuation must not hold (the tokenizer's special ids, the image and video placeholders)."""
    return torch.tensor(sorted({*model.tokenizer.all_special_ids, model.cfg.image_token_id, model.cfg.video_token_id}
                               - {None}))


def paired_differences(ours: dict, theirs: dict, name: str) -> None:
    """Per image, this model's agreement minus `name`'s: mean, its standard error, and on how many images it is lower."""
    import statistics

    print(f"\n| this model minus {name}, per image | mean | standard error | lower on |\n|---|---|---|---|")
    for key, values in ours.items():
        diff = [a - b for a, b in zip(values, theirs[key], strict=True)]
        print(f"| {key[0]} {key[1]} | {statistics.mean(diff):+.3f} | {statistics.stdev(diff) / len(diff) ** 0.5:.3f} | "
              f"{sum(d < 0 for d in diff)} of {len(diff)} |")


def agreement_over_images(model, args, special) -> dict[tuple[str, str], list[float]]:
    """The agreement on `--agreement-images` images (one image says little about a trained model's maps), per
    (method, statistic): the per-image values, also printed as mean, sd and range."""
    import statistics

    from vlens.data import make_pair
    from vlens.generation_attribution import GenerationAttributionSettings, attribute_generation
    from vlens.zoo.image_sizes import render_size

    values: dict[tuple[str, str], list[float]] = {}
    for seed in range(args.agreement_images):
        pair = make_pair(n_clean=3, n_corrupt=5, seed=seed, size=render_size(model, args.size))
        inputs = model.prepare(images=[pair.clean_image], prompts=["Describe the image."])
        with torch.no_grad():
            out = model.generate(inputs, max_new_tokens=args.new, stop_at_eos=False, return_type="output")
        new = torch.where(torch.isin(out.tokens[0], special), model.to_single_token("red"), out.tokens[0])
        result = attribute_generation(model, inputs, GenerationAttributionSettings(), continuation=new, progress=False)
        for method, agreement in result.agreement().items():
            for key in ("pearson_mean", "spearman_mean"):
                values.setdefault((method, key), []).append(agreement[key])
    print(f"\n| over {args.agreement_images} images | mean | sd | min | max |\n|---|---|---|---|---|")
    for (method, key), v in values.items():
        print(f"| {method} {key} | {statistics.mean(v):.3f} | {statistics.stdev(v):.3f} | {min(v):.3f} | {max(v):.3f} |")
    return values


if __name__ == "__main__":
    main()

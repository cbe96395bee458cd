"""Cost of checking forward-hook results (shape, dtype, device) in `vlens.core.hooks.HookPoint`.

Runs the same `run_with_hooks` forward with one hook on every non-attention hook point of the
decoder (each returning its input, so every call is checked), once with vlens's checked
HookPoint and once with TransformerLens's plain `add_hook`, interleaved; reports medians and
their ratio.

    python benchmarks/bench_hook_checks.py --runs 30 --threads 1
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from vlens import HookedVLM
    from vlens.core.hooks import HookPoint, _TLHookPoint
    from vlens.testing import random_image, tiny_hf_model, tiny_qwen_processor

    model = HookedVLM.from_hf(tiny_hf_model("qwen2_5_vl", n_layers=args.layers, d_model=args.d_model, n_heads=8,
                                            n_kv_heads=2), processor=tiny_qwen_processor())
    inputs = model.prepare(images=[random_image(112, 112, i) for i in range(4)],
                           prompts=["How many dots are there?"] * 4)
    names = [n for n in model.hook_dict if n.startswith("blocks.") and not n.endswith(("attn_scores", "pattern"))]
    hooks = [(name, lambda x, hook: x) for name in names]
    checked = HookPoint.add_hook

    def run() -> float:
        start = time.perf_counter()
        with torch.no_grad():
            model.run_with_hooks(inputs, fwd_hooks=hooks)
        return time.perf_counter() - start

    run()  # warm-up
    timings: dict[str, list[float]] = {"checked": [], "unchecked": []}
    try:
        for _ in range(args.runs):
            HookPoint.add_hook = checked
            timings["checked"].append(run())
            HookPoint.add_hook = _TLHookPoint.add_hook
            timings["unchecked"].append(run())
    finally:
        HookPoint.add_hook = checked
    a, b = statistics.median(timings["checked"]), statistics.median(timings["unchecked"])
    print(f"{len(hooks)} hooks, seq {inputs.input_ids.shape[1]}, batch 4: checked {a * 1e3:.2f} ms, "
          f"unchecked {b * 1e3:.2f} ms, ratio {a / b:.3f}")


if __name__ == "__main__":
    main()

"""Training-step time of LoRA SFT + L_focus against plain LoRA SFT (target: <= 1.25x).

One optimizer step = forward, answer-only cross-entropy (+ L_focus from attention captured at
the target layers only), backward, AdamW. Batches are collated once beforehand, so the ratio
is of the model work alone (collation costs the same in both and would only dilute it).
Runs alternate between the set-ups; medians and minima are compared (on a shared, loaded
machine the minimum is the steadier of the two). A third set-up, plain SFT with
the same attention patterns materialised (hooks at the focus layers, no L_focus), separates the
cost of the explicit attention path from the cost of the loss itself.

    python benchmarks/bench_sft.py [--steps 20] [--threads 2] [--configs embedded medium]

Configs: "embedded" has the embedded model's shapes (tiny Qwen2.5-VL: 4 layers, d_model 128,
168 px -> 36 image tokens; untrained weights, same compute); "medium": 8 layers, d_model 512,
two 336 px images per row (~290 image tokens per row).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from vlens import HookedVLM
from vlens.data import render_syndot, render_synpoly
from vlens.interventions.focus import capture_patterns, default_focus_layers
from vlens.training.data import SFTExample, collate, example_from_sample
from vlens.training.lora import add_lora, lora_parameters
from vlens.training.sft import SFTConfig, batch_losses


def _embedded():
    from vlens.recipes.embedded.recipe import build_untrained

    _, processor, hf = build_untrained(0)
    return HookedVLM.from_hf(hf.eval(), processor=processor), 224, 1


def _medium():
    from vlens.testing import tiny_hf_model, tiny_qwen_processor

    hf = tiny_hf_model(
        "qwen2_5_vl",
        n_layers=8,
        d_model=512,
        n_heads=8,
        n_kv_heads=2,
        d_mlp=1536,
        vision_depth=2,
        vision_width=128,
    )
    processor = tiny_qwen_processor(min_pixels=336 * 336, max_pixels=336 * 336)
    return HookedVLM.from_hf(hf, processor=processor), 336, 2


CONFIGS = {"embedded": _embedded, "medium": _medium}


def _examples(size: int, images_per_row: int, n: int) -> list[SFTExample]:
    out = []
    for i in range(n):
        samples = [
            (render_syndot if (i + j) % 2 == 0 else render_synpoly)(
                1 + (i + j) % 9, seed=10 * i + j, size=size
            )
            for j in range(images_per_row)
        ]
        first = example_from_sample(*samples[0])
        if images_per_row > 1:
            others = [example_from_sample(*s) for s in samples[1:]]
            first = SFTExample(
                [s[0] for s in samples],
                "How many dots are there?",
                first.answer,
                [first.objects[0]] + [o.objects[0] for o in others],
            )
        out.append(first)
    return out


def bench(name: str, steps: int, batch_size: int = 2) -> dict:
    model, size, images_per_row = CONFIGS[name]()
    torch.manual_seed(0)
    add_lora(model, rank=64)
    examples = _examples(size, images_per_row, batch_size * 4)
    batches = [collate(model, examples[i : i + batch_size]) for i in range(0, len(examples), batch_size)]
    layers = default_focus_layers(model.cfg.n_layers)
    params = list(lora_parameters(model).values())
    optimizer = torch.optim.AdamW(params, lr=1e-5)
    configs = {
        "plain": SFTConfig(focus_weight=0.0),
        "focus": SFTConfig(focus_weight=1.0, focus_layers=layers),
        "plain_explicit": SFTConfig(focus_weight=0.0),
    }
    model.train()

    def step(key: str, batch) -> float:
        config = configs[key]
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        if key == "plain_explicit":  # the focus layers leave SDPA, but no L_focus
            with capture_patterns(model, layers, batch.prompt_final):
                sft, focus = batch_losses(model, batch, config, layers)
        else:
            sft, focus = batch_losses(model, batch, config, layers)
        loss = sft + focus if focus is not None else sft
        loss.backward()
        optimizer.step()
        return time.perf_counter() - start

    for key in configs:  # warm-up
        step(key, batches[0])
    times = {key: [] for key in configs}
    for i in range(steps):
        order = list(configs) if i % 2 == 0 else list(reversed(configs))
        for key in order:
            times[key].append(step(key, batches[i % len(batches)]))
    plain, focus = statistics.median(times["plain"]), statistics.median(times["focus"])
    explicit = statistics.median(times["plain_explicit"])
    return {
        "config": name,
        "layers": model.cfg.n_layers,
        "focus_layers": layers,
        "d_model": model.cfg.d_model,
        "seq_len": batches[0].inputs.seq_len,
        "image_tokens_per_row": int(len(batches[0].inputs.regions.image[0])),
        "batch": batch_size,
        "plain_ms": round(1000 * plain, 1),
        "focus_ms": round(1000 * focus, 1),
        "ratio": round(focus / plain, 3),
        "plain_explicit_ms": round(1000 * explicit, 1),
        "loss_only_ratio": round(focus / explicit, 3),
        "min_ms": {key: round(1000 * min(values), 1) for key, values in times.items()},
        "min_ratio": round(min(times["focus"]) / min(times["plain"]), 3),
        "steps": steps,
        "threads": torch.get_num_threads(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20, help="timed steps per set-up (medium: at most 8)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    for name in args.configs:
        print(json.dumps(bench(name, min(args.steps, 8) if name == "medium" else args.steps)), flush=True)


if __name__ == "__main__":
    main()

"""Text-only control of the existence question (RESULTS.md, issue 34): the embedded model's fresh
4-layer decoder, no image. Where the image tokens would be, a list of colour words (1-5 colours
among filler words, in a random order); then "is there a {colour} object ?" and the answer.

    python benchmarks/bench_binding_text.py [--lr 2e-3] [--steps 300] [--order list-first|question-first]
        [--length 5] [--disjoint]

--length: slots of the list (the image has 36 tokens at 168 px); --disjoint: the list names each
colour with another word (as image tokens carry colour in their own code, not in the words').
Prints one JSON line: the loss every 25 steps and the held-out accuracy of yes/no (600 lists).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch

from vlens.data.palette import OBJECT_COLORS
from vlens.recipes.embedded.loop import run_loop
from vlens.recipes.embedded.recipe import build_untrained
from vlens.recipes.embedded.settings import Schedule

ALIAS = dict(zip(OBJECT_COLORS, ("triangle", "square", "pentagon", "hexagon", "star", "circle"), strict=True))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--order", choices=["list-first", "question-first"], default="list-first")
    parser.add_argument("--length", type=int, default=5)
    parser.add_argument("--disjoint", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    tokenizer, _, model = build_untrained(0, 168)
    ids = tokenizer.convert_tokens_to_ids
    generator = torch.Generator().manual_seed(0)

    def draw(high: int) -> int:
        return int(torch.randint(high, (1,), generator=generator))

    def example() -> tuple[list[int], list[int], str]:
        colours = [OBJECT_COLORS[draw(len(OBJECT_COLORS))] for _ in range(1 + draw(5))]
        target = OBJECT_COLORS[draw(len(OBJECT_COLORS))]
        answer = "yes" if target in colours else "no"
        items = [ALIAS[c] if args.disjoint else c for c in colours] + ["object"] * (args.length - len(colours))
        order = torch.randperm(len(items), generator=generator).tolist()
        listed = ["<|vision_start|>", *(items[i] for i in order), "<|vision_end|>"]
        question = ["is", "there", "a", target, "object", "?"]
        body = listed + question if args.order == "list-first" else question + listed
        words = ["<|im_start|>", "user", "\n", *body, "<|im_end|>", "\n", "<|im_start|>", "assistant", "\n"]
        tokens = ids([*words, answer, "<|im_end|>"])
        return tokens, [-100] * len(words) + tokens[-2:], answer

    train = [example() for _ in range(6000)]
    test = [example() for _ in range(600)]

    def step_fn(_step: int, rows: list[int]) -> tuple[torch.Tensor, dict[str, float]]:
        out = model(input_ids=torch.tensor([train[r][0] for r in rows]), labels=torch.tensor([train[r][1] for r in rows]))
        return out.loss, {"loss": out.loss.item()}

    schedule = Schedule(steps=args.steps, batch_size=48, learning_rate=args.lr, warmup_steps=20, log_every=25)
    start = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        result = run_loop({"model": model}, step_fn, len(train), schedule, Path(tmp) / "log.jsonl", progress=False)
    model.eval()
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([e[0] for e in test])).logits[:, -3]
    said_yes = logits[:, ids("yes")] > logits[:, ids("no")]
    accuracy = sum((bool(y) == (e[2] == "yes")) for y, e in zip(said_yes, test, strict=True)) / len(test)
    print(json.dumps({
        "order": args.order, "length": args.length, "disjoint": args.disjoint, "lr": args.lr,
        "steps": args.steps, "train_s": round(time.time() - start),
        "loss_every_25_steps": [round(r["loss"], 3) for r in result["log"] if "loss" in r],
        "accuracy": round(accuracy, 3), "n": len(test),
        "majority": round(max(p := sum(e[2] == "yes" for e in test) / len(test), 1 - p), 3),
    }))


if __name__ == "__main__":
    main()

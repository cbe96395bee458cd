"""How well an embedded-model stage fits its own training samples against fresh ones (issue 40: is the
readout of high counts limited by fitting or by generalising?).

    PYTHONPATH=. python benchmarks/bench_fit_gap.py MODEL_DIR [--n 300] [--sources S ...] [--threads 1]

The stage's own training samples are redrawn from its recipe (seed, example count and mix, read from the
folder's evaluation.json): for each source, the first `--n` samples of that source in the training set, with
the appearance variety the stage trained on (`varied_sample`: sizes, redraws, blur, grain, JPEG). The fresh
samples come from the same distribution with a seed no stage uses (`--fresh-seed`). Both are asked the
training question and answered greedily. Per source and set: accuracy with a 95% Wilson interval, split into
1-7 and 8-10 objects for counting answers. The two sets are different images, so the gap is an unpaired
difference (its interval: the normal approximation of two proportions). Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch

from vlens.recipes.embedded.model_card import training_stages
from vlens.utils.stats import wilson_interval

FRESH_SEED = 12_345  # no stage of training/ trains with it


def stage_recipe(folder: Path) -> tuple[int, int, dict[str, float]]:
    """(seed, examples, mix) of the stage that wrote `folder` (the last of its card's stages)."""
    stage = training_stages(json.loads((folder / "evaluation.json").read_text()))[-1]
    return int(stage["seed"]), int(stage["n_examples"]), dict(stage["mix"])


def accuracy(hits: list[bool]) -> dict:
    low, high = wilson_interval(sum(hits), len(hits))
    return {"accuracy": round(sum(hits) / len(hits), 3), "ci95": [round(float(low), 3), round(float(high), 3)],
            "n": len(hits)}


def gap(train: list[bool], fresh: list[bool]) -> dict:
    """train minus fresh accuracy, with a normal-approximation 95% interval (different images: unpaired)."""
    p, q = sum(train) / len(train), sum(fresh) / len(fresh)
    se = math.sqrt(p * (1 - p) / len(train) + q * (1 - q) / len(fresh))
    return {"gap": round(p - q, 3), "ci95": [round(p - q - 1.96 * se, 3), round(p - q + 1.96 * se, 3)]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", type=Path, help="a stage folder (training/vN/STAGE)")
    parser.add_argument("--n", type=int, default=300, help="samples per source and set")
    parser.add_argument("--sources", nargs="*", default=["counting/synpoly", "counting/groups", "arithmetic"])
    parser.add_argument("--fresh-seed", type=int, default=FRESH_SEED)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()

    from vlens.recipes.embedded.evaluate import answer_questions, is_correct
    from vlens.recipes.embedded.recipe import load_for_continuation
    from vlens.recipes.embedded.training_set import source_makers, training_sources, varied_sample

    torch.set_num_threads(args.threads)
    start = time.time()
    seed, examples, mix = stage_recipe(args.model)
    missing = [name for name in args.sources if name not in mix]
    if missing:
        parser.error(f"{missing} are not in the stage's mix {sorted(mix)}")
    _, processor, model = load_for_continuation(args.model)
    makers = source_makers(vary=True)
    drawn = {"train": training_sources(examples, seed, mix), "fresh": training_sources(examples, args.fresh_seed, mix)}
    table: dict[str, dict] = {}
    for name in args.sources:
        hits: dict[str, dict[str, list[bool]]] = {}
        for label, picks in drawn.items():
            seeds = [sample_seed for source, sample_seed in picks if source == name][: args.n]
            samples = [varied_sample(makers[name], sample_seed) for sample_seed in seeds]
            records = [record for _, _, record in samples]
            with torch.no_grad():
                answers = answer_questions(model.eval(), processor, [image for image, _, _ in samples],
                                           [record["question"] for record in records])
            split: dict[str, list[bool]] = {"all": []}
            for answer, record in zip(answers, records, strict=True):
                hit = is_correct(answer, record)
                split["all"].append(hit)
                if "count" in record:
                    split.setdefault("8-10" if record["count"] >= 8 else "1-7", []).append(hit)
            hits[label] = split
        table[name] = {label: {part: accuracy(values) for part, values in sorted(split.items())}
                       for label, split in hits.items()}
        table[name]["gap"] = {part: gap(hits["train"][part], hits["fresh"][part])
                              for part in hits["train"] if part in hits["fresh"]}
    print(json.dumps({"model": str(args.model), "seed": seed, "examples": examples, "fresh_seed": args.fresh_seed,
                      "seconds": round(time.time() - start), "sources": table}, indent=1))


if __name__ == "__main__":
    main()

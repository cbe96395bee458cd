"""Paired comparison of embedded-model checkpoints on the same held-out images (issue 40: which stage to ship).

    PYTHONPATH=. python benchmarks/compare_checkpoints.py DIR_A DIR_B [DIR_C ...] [--n 300] [--sources S ...]
        [--split card|selection]

Every folder answers the same held-out questions (`held_out_samples`, the model cards' images); for each
source and each pair of folders it prints both accuracies, the images only one of them answers right and
the exact McNemar p of those discordant pairs (vlens.flow.mcnemar_exact). Two cards' intervals that
overlap say little: the paired test uses that both models saw the same images. Choose between candidates
(seeds, mixes, which stage to ship) with `--split selection`, a second held-out range, so that the shipped
card's images play no part in the choice. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import itertools
import json
import time
from collections import defaultdict


def paired_table(sources: list[str], hits: dict[str, list[bool]]) -> dict:
    """{"A vs B": {source: {"a", "b", "a_only", "b_only", "p"}}} for every pair of models, per source."""
    from vlens.flow import mcnemar_exact

    rows: dict[str, dict] = {}
    for first, second in itertools.combinations(hits, 2):
        by_source: dict[str, tuple[list[bool], list[bool]]] = defaultdict(lambda: ([], []))
        for source, a, b in zip(sources, hits[first], hits[second], strict=True):
            by_source[source][0].append(a)
            by_source[source][1].append(b)
        table = {}
        for source, (a, b) in sorted(by_source.items()):
            test = mcnemar_exact(a, b)
            table[source] = {"a": round(sum(a) / len(a), 3), "b": round(sum(b) / len(b), 3),
                             "a_only": int(test["a_only"]), "b_only": int(test["b_only"]),
                             "p": float(f"{test['p']:.3g}")}  # 3 significant digits: small p stay readable
        rows[f"{first} vs {second}"] = table
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="+", help="two or more model folders")
    parser.add_argument("--n", type=int, default=300, help="held-out samples per source")
    parser.add_argument("--sources", nargs="*", default=None, help="held-out sources (default: all)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--split", choices=["card", "selection"], default="card",
                        help="the model cards' held-out images, or a second range for choosing between models")
    args = parser.parse_args()
    if len(args.models) < 2:
        parser.error("give at least two model folders")

    import torch

    from vlens.recipes.embedded.evaluate import answer_questions, is_correct
    from vlens.recipes.embedded.recipe import load_for_continuation
    from vlens.recipes.embedded.training_set import held_out_samples

    torch.set_num_threads(args.threads)
    start = time.time()
    samples = held_out_samples(args.n, args.sources, split=args.split)
    images, records = [image for image, _ in samples], [record for _, record in samples]
    hits = {}
    for folder in args.models:
        _, processor, model = load_for_continuation(folder)
        with torch.no_grad():
            answers = answer_questions(model.eval(), processor, images, [r["question"] for r in records])
        hits[folder] = [is_correct(a, r) for a, r in zip(answers, records, strict=True)]
    print(json.dumps({"n": args.n, "split": args.split, "seconds": round(time.time() - start),
                      "pairs": paired_table([r["source"] for r in records], hits)}, indent=1))


if __name__ == "__main__":
    main()

"""Which objects' tokens a named-colour count reads (issue 40's arithmetic target, a causal test).

    PYTHONPATH=. python benchmarks/bench_count_selection.py [--n 300] [--model DIR] [--how mean] [--threads 1]

On the held-out arithmetic images the model is asked the count of the question's second colour ("How many
<c2> objects are there?"), which `bench_arithmetic_limits.py` finds is often answered with another colour's
count. Where another colour has a larger group than c2, the image tokens are split into the named group's
(tokens any c2 object's box touches and no object of the larger group does), the larger group's (the
reverse) and the rest, and the vision tower's output at one set is ablated (`vlens.flow.ablation`'s hook,
`--how` mean / zero / resample) before the decoder runs:
- named: the c2 objects' own tokens; a count that reads them should drop to about 0;
- other group: the larger group's tokens; a count that reads the named colour should not move;
- random: as many tokens as the larger group's, drawn from tokens neither group touches (the control).
Per condition: the greedy first answer token's accuracy against c2's true count, the share answered with the
larger group's count, and the mean answered number (answers that are not numbers are left out of the mean),
with 95% intervals (Wilson; bootstrap over images for the mean). Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter

import torch
from bench_arithmetic_limits import sub_counts

from vlens.data.templates import COUNT_COLOR
from vlens.flow.ablation import ablation_hook, site_activations
from vlens.flow.batch import object_selection
from vlens.utils.stats import bootstrap_interval, wilson_interval

CONDITIONS = ("clean", "named", "other group", "random")


def groups(record: dict) -> tuple[str, list[dict], list[dict]] | None:
    """(c2, its objects, the objects of the largest other colour) when that colour outnumbers c2, else None."""
    _, c2, _, k2, _ = sub_counts(record)
    counts = Counter(obj["color"] for obj in record["objects"] if obj["color"] != c2)
    if not counts:
        return None
    other, k_other = counts.most_common(1)[0]
    if k_other <= k2:
        return None
    pick = [obj for obj in record["objects"] if obj["color"] == c2], [
        obj for obj in record["objects"] if obj["color"] == other]
    return c2, *pick


def exclusive_tokens(inputs, row: int, mine: list[dict], theirs: list[dict]) -> tuple[torch.Tensor, torch.Tensor,
                                                                                          torch.Tensor]:
    """Sequence positions touched only by `mine`, only by `theirs`, and by neither (this row's one image)."""
    def touched(objects: list[dict]) -> torch.Tensor:
        found = [object_selection(inputs, row, obj["bbox"]).positions.cpu() for obj in objects]
        return torch.cat(found).unique() if found else torch.zeros(0, dtype=torch.long)

    a, b = touched(mine), touched(theirs)
    image = inputs.token_regions.image[row].cpu()
    return a[~torch.isin(a, b)], b[~torch.isin(b, a)], image[~torch.isin(image, torch.cat([a, b]))]


def number(word: str) -> int | None:
    return int(word) if word.strip().isdigit() else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=300, help="held-out arithmetic images")
    parser.add_argument("--model", default=None, help="a model folder (default: the embedded model)")
    parser.add_argument("--how", default="mean", choices=("mean", "zero", "resample"))
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0, help="the random control's draw")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    import vlens
    from vlens.recipes.embedded.training_set import held_out_samples

    model = vlens.HookedVLM.from_pretrained(args.model) if args.model else vlens.load()
    start = time.time()
    chosen = [(image, record, g) for image, record in held_out_samples(args.n, ["arithmetic"])
              if (g := groups(record)) is not None]
    generator = torch.Generator().manual_seed(args.seed)
    answers: dict[str, list[int | None]] = {c: [] for c in CONDITIONS}
    truth, larger, n_tokens = [], [], {c: [] for c in CONDITIONS[1:]}
    for begin in range(0, len(chosen), args.batch_size):
        part = chosen[begin:begin + args.batch_size]
        inputs = model.prepare(images=[image for image, _, _ in part],
                               prompts=[COUNT_COLOR.format(color=g[0]) for _, _, g in part])
        sets: dict[str, list[torch.Tensor]] = {c: [] for c in CONDITIONS[1:]}
        for row, (_, _, (_, mine, theirs)) in enumerate(part):
            named, other, neither = exclusive_tokens(inputs, row, mine, theirs)
            k = min(len(other), len(neither))
            draw = neither[torch.randperm(len(neither), generator=generator)[:k]].sort().values
            for name, positions in zip(CONDITIONS[1:], (named, other, draw), strict=True):
                sets[name].append(positions)
                n_tokens[name].append(len(positions))
            truth.append(len(mine))
            larger.append(len(theirs))
        activations = site_activations(model, inputs, "vision")
        final = inputs.token_regions.final
        with torch.no_grad():
            for condition in CONDITIONS:
                if condition == "clean":
                    logits = model(inputs)
                else:
                    hook = ablation_hook("vision", inputs, sets[condition], args.how, activations)
                    with model.hooks(fwd_hooks=[hook]):
                        logits = model(inputs)
                top = logits[torch.arange(len(part)), final.to(logits.device)].argmax(-1).tolist()
                answers[condition] += [number(model.tokenizer.decode([t])) for t in top]
    table = {}
    for condition in CONDITIONS:
        said = answers[condition]
        right = sum(a == t for a, t in zip(said, truth, strict=True))
        as_larger = sum(a == k for a, k in zip(said, larger, strict=True))
        numbers = torch.tensor([a for a in said if a is not None], dtype=torch.float64)
        low, high = bootstrap_interval(numbers, n_resamples=2000, seed=args.seed)
        row = {
            "accuracy": round(right / len(said), 3), "accuracy 95% CI": [round(float(v), 3) for v in
                                                                         wilson_interval(right, len(said))],
            "answered the larger group's count": round(as_larger / len(said), 3),
            "mean answered number": round(float(numbers.mean()), 2), "mean 95% CI": [round(float(low), 2),
                                                                                     round(float(high), 2)],
            "not a number": len(said) - len(numbers),
        }
        if condition != "clean":
            row["mean tokens ablated"] = round(sum(n_tokens[condition]) / len(n_tokens[condition]), 1)
        table[condition] = row
    print(json.dumps({
        "model": args.model or "embedded", "how": args.how, "images": len(chosen), "of": args.n,
        "mean true count": round(sum(truth) / len(truth), 2), "mean larger group": round(sum(larger) / len(larger), 2),
        "seconds": round(time.time() - start), "conditions": table,
    }, indent=1))


if __name__ == "__main__":
    main()

"""What limits the embedded model's arithmetic and SynPoly counting (issue 40's two missed targets).

    PYTHONPATH=. python benchmarks/bench_arithmetic_limits.py [--n 300] [--model DIR] [--against DIR] [--threads 1]

Arithmetic asks "How many <c1> and <c2> objects are there in total?" or "How many more <c1> than <c2>
objects are there?". On the same held-out images it also asks the two sub-counts the answer needs
("How many <c1> objects are there?", a counting template the model trains on) and reports:
- sub-count accuracy, and arithmetic accuracy when both sub-counts are right vs when one is wrong;
- consistency: how often the arithmetic answer equals the sum / difference of the model's own sub-counts
  (high consistency with wrong sub-counts: counting limits it; low consistency with right ones: combining does).
SynPoly counting is broken down by question template (all objects, one colour, one shape), and counting a
named colour or shape among other objects (the counting/subset source) by error kind (off by one, the total,
the distractors' number), by number of distractors, and by whether an asked object shares a merged image
token (a cell of the model's token grid) with a distractor, where one token's features mix both. SynPoly's
misses are sorted by direction (one too few, one too many) and split by count band and by how close the
two nearest objects are (the gap between their bounding boxes, in the rendered image's pixels), within
each count band so that crowding and count are not confounded.
With --against DIR, a second model answers the same questions on the same images and "paired_against" compares
the two per image on every row whose images do not depend on a model's own answers (arithmetic, by operation,
each sub-count, both sub-counts, SynPoly, counting among distractors): images only one model answers right, and
the exact McNemar p of those discordant pairs.
Prints one JSON object; RESULTS.md records the numbers.
"""

from __future__ import annotations

import argparse
import json
import re
import time
from collections import defaultdict

QUESTION = re.compile(r"How many (more )?(\w+) (?:and|than) (\w+) objects")


def sub_counts(record: dict) -> tuple[str, str, int, int, bool]:
    """(c1, c2, true count of c1, true count of c2, is_difference) of an arithmetic record."""
    match = QUESTION.match(record["question"])
    if match is None:
        raise ValueError(f"not an arithmetic question: {record['question']!r}")
    difference, c1, c2 = bool(match.group(1)), match.group(2), match.group(3)
    colours = [obj["color"] for obj in record["objects"]]
    return c1, c2, colours.count(c1), colours.count(c2), difference


def combine(a: str, b: str, difference: bool) -> str | None:
    """The model's own sub-counts combined as the question asks (None if either is not a number)."""
    if not (a.isdigit() and b.isdigit()):
        return None
    return str(int(a) - int(b) if difference else int(a) + int(b))


def _table(groups: dict[str, list[bool]]) -> dict:
    return {name: {"accuracy": round(sum(hits) / len(hits), 3), "n": len(hits)} for name, hits in sorted(groups.items())}


def arithmetic_limits(records: list[dict], answers: list[str], first: list[str], second: list[str]) -> dict:
    """Sub-count accuracy, arithmetic accuracy given the sub-counts, and consistency with them; each sub-count's
    answers sorted by `miss_kind`."""
    groups: dict[str, list[bool]] = defaultdict(list, paired_hits(records, answers, first, second))
    kinds: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for record, answer, a, b in zip(records, answers, first, second, strict=True):
        c1, c2, k1, k2, difference = sub_counts(record)
        correct = answer == record["answer"]
        subs_right = a == str(k1) and b == str(k2)
        given = "both right" if subs_right else "a sub-count wrong"
        # rows whose images depend on the model's own sub-counts (paired_hits has the others)
        groups[f"arithmetic | {'both sub-counts right' if subs_right else 'a sub-count wrong'}"].append(correct)
        groups[f"answer = own sub-counts combined | {given}"].append(answer == combine(a, b, difference))
        colours = [obj["color"] for obj in record["objects"]]
        for name, said, colour in (("c1", a, c1), ("c2", b, c2)):
            kinds[f"sub-count {name} answers"][miss_kind(said, colour, colours)] += 1
    return {**_table(groups), **{name: dict(sorted(counts.items())) for name, counts in sorted(kinds.items())}}


def paired_hits(records: list[dict], answers: list[str], first: list[str], second: list[str]) -> dict[str, list[bool]]:
    """Per-image hits of the arithmetic rows whose images are fixed by the questions alone (not by the model's
    sub-counts), in record order, so that two models' lists pair image by image."""
    rows: dict[str, list[bool]] = defaultdict(list)
    for record, answer, a, b in zip(records, answers, first, second, strict=True):
        _, _, k1, k2, difference = sub_counts(record)
        correct = answer == record["answer"]
        rows["arithmetic"].append(correct)
        rows[f"arithmetic/{'difference' if difference else 'sum'}"].append(correct)
        rows["sub-count c1"].append(a == str(k1))
        rows["sub-count c2"].append(b == str(k2))
        rows["both sub-counts"].append(a == str(k1) and b == str(k2))
    return dict(rows)


def paired_against(ours: dict[str, list[bool]], theirs: dict[str, list[bool]]) -> dict:
    """{row: {"model", "against", "model_only", "against_only", "p"}}: accuracies, the images only one model answers
    right, and the exact McNemar p, for every row both hold."""
    from vlens.flow import mcnemar_exact

    table = {}
    for name in sorted(ours.keys() & theirs.keys()):
        a, b = ours[name], theirs[name]
        test = mcnemar_exact(a, b)
        table[name] = {"model": round(sum(a) / len(a), 3), "against": round(sum(b) / len(b), 3),
                       "model_only": int(test["a_only"]), "against_only": int(test["b_only"]),
                       "p": float(f"{test['p']:.3g}")}
    return table


def miss_kind(said: str, colour: str, colours: list[str]) -> str:
    """A count of `colour` among objects of `colours` sorted: right, off by one, else another colour's count (the
    named colour was swapped for another), else within one of every object (the colour was ignored), else other."""
    truth = colours.count(colour)
    if not said.isdigit():
        return "other"
    value = int(said)
    if value == truth:
        return "right"
    if abs(value - truth) == 1:
        return "off by one"
    if value in {colours.count(other) for other in set(colours) - {colour}}:
        return "another colour's count"
    return "the image's total +-1" if abs(value - len(colours)) <= 1 else "other"


def by_template(records: list[dict], answers: list[str]) -> dict:
    groups: dict[str, list[bool]] = defaultdict(list)
    for record, answer in zip(records, answers, strict=True):
        groups[record["template"]].append(answer == record["answer"])
    return _table(groups)


def token_cells(obj: dict, image_size: int, grid: int) -> set[tuple[int, int]]:
    """The cells of a grid x grid token grid that an object's bounding square (centre +- size) touches."""
    def cell(value: float) -> int:
        return min(grid - 1, max(0, int(value / image_size * grid)))

    (cx, cy), r = obj["center"], obj["size"]
    return {(i, j) for i in range(cell(cx - r), cell(cx + r) + 1) for j in range(cell(cy - r), cell(cy + r) + 1)}


def closest_gap(objects: list[dict]) -> float | None:
    """Pixels between the two nearest objects' bounding boxes (x0, y0, x1, y1): the larger of the horizontal and
    vertical gaps, so 0 or less means the boxes touch or overlap; None with fewer than two objects."""
    gaps = [
        max(max(a["bbox"][0], b["bbox"][0]) - min(a["bbox"][2], b["bbox"][2]),
            max(a["bbox"][1], b["bbox"][1]) - min(a["bbox"][3], b["bbox"][3]))
        for i, a in enumerate(objects) for b in objects[i + 1:]
    ]
    return min(gaps) if gaps else None


def count_band(count: int) -> str:
    return "1" if count == 1 else "2-4" if count <= 4 else "5-7" if count <= 7 else "8+"


def synpoly_limits(records: list[dict], answers: list[str], near: float = 6.0) -> dict:
    """SynPoly counting: miss directions, accuracy by count band, and by the closest pair (gap <= `near` px or
    not), overall and within each count band (the objects counted are all the objects drawn: the held-out
    images hold no distractors)."""
    misses: dict[str, int] = defaultdict(int)
    groups: dict[str, list[bool]] = defaultdict(list)
    for record, answer in zip(records, answers, strict=True):
        truth, correct = int(record["answer"]), answer == record["answer"]
        if not correct:
            off = int(answer) - truth if answer.isdigit() else None
            misses["one too few" if off == -1 else "one too many" if off == 1 else "other"] += 1
        band = count_band(truth)
        groups[f"count {band}"].append(correct)
        gap = closest_gap(record["objects"])
        if gap is not None:
            closeness = f"closest gap <= {near:g} px" if gap <= near else f"closest gap > {near:g} px"
            groups[closeness].append(correct)
            groups[f"count {band}, {closeness}"].append(correct)
    return {"misses": dict(sorted(misses.items())), **_table(groups)}


def subset_limits(records: list[dict], answers: list[str], grid: int) -> dict:
    """Counting among distractors: accuracy by error kind, by distractors (4 or more pooled) and by a shared token."""
    kinds: dict[str, int] = defaultdict(int)
    groups: dict[str, list[bool]] = defaultdict(list)
    for record, answer in zip(records, answers, strict=True):
        n, d = int(record["answer"]), int(record["distractors"])
        correct = answer == record["answer"]
        if correct:
            kind = "right"
        elif answer == str(n + d):
            kind = "the total (asked + distractors)"
        elif answer == str(d):
            kind = "the distractors' number"
        elif answer.isdigit() and abs(int(answer) - n) == 1:
            kind = "off by one"
        else:
            kind = "other"
        kinds[kind] += 1
        groups[f"distractors {min(d, 4)}{'+' if d >= 4 else ''}"].append(correct)
        asked = set(record["targets"])
        target_cells, other_cells = set(), set()
        for obj in record["objects"]:
            (target_cells if obj["id"] in asked else other_cells).update(token_cells(obj, record["image_size"], grid))
        groups["an asked object shares a token with a distractor" if target_cells & other_cells
               else "no token shared with a distractor"].append(correct)
    return {"answers": dict(sorted(kinds.items())), **_table(groups)}


def model_answers(folder: str, arithmetic: list, poly: list, subset: list) -> dict[str, list[str]]:
    """One model's answers to the held-out questions: arithmetic, its two sub-counts, SynPoly, counting among
    distractors (samples are (image, record) pairs)."""
    from vlens.data.templates import COUNT_COLOR
    from vlens.recipes.embedded.evaluate import answer_questions
    from vlens.recipes.embedded.recipe import load_for_continuation

    _, processor, model = load_for_continuation(folder)
    model.eval()

    def ask(samples: list, questions: list[str]) -> list[str]:
        return answer_questions(model, processor, [image for image, _ in samples], questions)

    parts = [sub_counts(record) for _, record in arithmetic]
    return {
        "arithmetic": ask(arithmetic, [record["question"] for _, record in arithmetic]),
        "first": ask(arithmetic, [COUNT_COLOR.format(color=p[0]) for p in parts]),
        "second": ask(arithmetic, [COUNT_COLOR.format(color=p[1]) for p in parts]),
        "synpoly": ask(poly, [record["question"] for _, record in poly]),
        "subset": ask(subset, [record["question"] for _, record in subset]),
    }


def all_paired_hits(records: dict[str, list[dict]], said: dict[str, list[str]]) -> dict[str, list[bool]]:
    """paired_hits plus SynPoly and counting among distractors, per image."""
    hits = paired_hits(records["arithmetic"], said["arithmetic"], said["first"], said["second"])
    for source in ("synpoly", "subset"):
        hits[source] = [answer == record["answer"] for record, answer in zip(records[source], said[source], strict=True)]
    return hits


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=300, help="held-out samples per source")
    parser.add_argument("--model", default=None, help="a model folder (default: the embedded model)")
    parser.add_argument("--against", default=None, help="a second model folder, compared per image on the same questions")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()

    import torch

    from vlens.recipes.embedded.training_set import held_out_samples
    from vlens.zoo import WEIGHTS_FOLDER
    from vlens.zoo.processor import CELL, image_size_of, load_processor

    torch.set_num_threads(args.threads)
    folder = args.model or str(WEIGHTS_FOLDER)
    start = time.time()
    samples = {"arithmetic": held_out_samples(args.n, ["arithmetic"]), "synpoly": held_out_samples(args.n, ["counting/synpoly"]),
               "subset": held_out_samples(args.n, ["counting/subset"])}
    records = {source: [record for _, record in pairs] for source, pairs in samples.items()}
    said = model_answers(folder, samples["arithmetic"], samples["synpoly"], samples["subset"])
    report = {
        "model": folder, "n": args.n,
        "arithmetic": arithmetic_limits(records["arithmetic"], said["arithmetic"], said["first"], said["second"]),
        "synpoly_by_template": by_template(records["synpoly"], said["synpoly"]),
        "synpoly": synpoly_limits(records["synpoly"], said["synpoly"]),
        "subset": subset_limits(records["subset"], said["subset"], image_size_of(load_processor(folder)) // CELL),
    }
    if args.against:
        other = model_answers(args.against, samples["arithmetic"], samples["synpoly"], samples["subset"])
        report["against"] = args.against
        report["paired_against"] = paired_against(all_paired_hits(records, said), all_paired_hits(records, other))
    print(json.dumps({**report, "seconds": round(time.time() - start)}, indent=1))


if __name__ == "__main__":
    main()

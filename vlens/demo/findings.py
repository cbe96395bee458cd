"""The paper's six findings on the model under study: each shown or not shown by an explicit test.

Every verdict and every number in the statements is computed from the other sections' results
(their `data`, as results.json holds it); only the paper's claim and the rule of each test are
fixed text. A test whose stage did not run, or whose data lacks what it needs, is "not tested"
with the reason. Level: 0.05 for p-values, 95% intervals.

1. subitizing: counts 1-4 are answered more accurately than counts >= 5 (one-sided Fisher exact test per
   counting style, Holm over the styles), with the test's power and the best split of the counts.
2. hand-off: patching the image tokens overwrites the answer in early layers and the final prompt
   position from a middle layer on (the hand-off layer, with a bootstrap interval over pairs).
3. late logit lens: the true count becomes the top token late, in the upper half of the layers.
4. head classes: each of the four HeadLens classes has a head whose class is stable over
   bootstrap resamples of the examples, and its count's interval excludes 0.
5. interventions: +SFT, +L_focus and +beta each raise held-out counting accuracy, across seeds.
6. Jaccard ordering: counting shares more heads with arithmetic and spatial reasoning than with
   colour, above chance (Holm) and in the same order on two independent samples.
"""

from __future__ import annotations

import html
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch

from vlens.demo.report_sections import Section
from vlens.evaluation.subitizing import best_split
from vlens.utils.errors import UserInputError
from vlens.utils.power import minimum_detectable_gap
from vlens.utils.stats import (
    fisher_greater,
    format_p,
    format_share,
    holm,
    mean_interval,
    p_number,
    wilson_interval,
)

LEVEL = 0.05
SMALL_COUNTS = 4  # the paper's subitizing range: 1-4
# Our choice: a "band" of layers (the hand-off's middle, the lens's late layers) is read only when each
# half of the stack holds >= 4 layers, so that a one- or two-layer bootstrap interval fits inside a half
# with room on both sides; below that the tests say whether the event happens, not where in depth.
MIN_BAND_LAYERS = 8
PAPER_CLASSES = ("visual grounding", "cross-modal routing", "counting aggregation", "awareness")
TITLE = "The paper's findings on this model"


@dataclass
class Finding:
    """One of the paper's findings as tested here: shown True / False, or None (not tested)."""

    key: str
    name: str
    claim: str  # what the paper reports
    test: str  # the rule that decides "shown"
    shown: bool | None
    evidence: str  # generated from the numbers
    numbers: dict = field(default_factory=dict)
    caveat: str = ""  # what this model can and cannot show about the claim (e.g. too few layers for a band)
    testable: bool = True  # False: the test cannot come out either way on this model (says why in evidence)

    @property
    def verdict(self) -> str:
        if self.shown is None and not self.testable:
            return "not testable on this model"
        return {True: "shown", False: "not shown", None: "not tested"}[self.shown]

    def to_dict(self) -> dict:
        return {"key": self.key, "name": self.name, "claim": self.claim, "test": self.test, "shown": self.shown,
                "verdict": self.verdict, "evidence": self.evidence, "numbers": self.numbers, "caveat": self.caveat,
                "testable": self.testable}


def _untested(key: str, name: str, claim: str, test: str, why: str) -> Finding:
    return Finding(key, name, claim, test, None, f"Not tested: {why}.")


def _untestable(key: str, name: str, claim: str, test: str, why: str, numbers: dict | None = None) -> Finding:
    """The test ran but cannot come out either way on this model (e.g. a task it answers at chance)."""
    return Finding(key, name, claim, test, None, f"Not testable on this model: {why}.", numbers or {},
                   testable=False)


# ---------------------------------------------------------------------- 1. subitizing
SUBITIZING = ("subitizing", "Subitizing", "small counts (1-4) are counted reliably, larger ones degrade",
              f"per counting style: counts 1-{SMALL_COUNTS} vs counts >= {SMALL_COUNTS + 1}, one-sided Fisher exact "
              f"test that the small counts are answered more accurately; shown if Holm-adjusted p < {LEVEL} on a "
              "style. Beside it: the smallest gap the test detects with 80% power at these numbers of images, and "
              "the best split of the counts with a permutation p-value over the choice of split")


def _style_test(section: Section) -> dict | None:
    """The paper's 1-4 split, its power and the best split on one counting section (None: untestable)."""
    predictions = section.data["predictions"]
    small = [p for p in predictions if p["target"] <= SMALL_COUNTS]
    large = [p for p in predictions if p["target"] > SMALL_COUNTS]
    if not small or not large:
        return None
    hits_small, hits_large = sum(bool(p["correct"]) for p in small), sum(bool(p["correct"]) for p in large)
    p_value = fisher_greater(hits_small, len(small), hits_large, len(large))
    large_accuracy = hits_large / len(large)
    per_count = [len([p for p in predictions if p["target"] == c]) for c in section.data["counts"]]
    split = best_split([p["target"] for p in predictions], [bool(p["correct"]) for p in predictions])
    return {"style": section.data.get("style", "counting"), "small_accuracy": hits_small / len(small),
            "small_n": len(small), "large_accuracy": large_accuracy, "large_n": len(large), "p_value": p_value,
            "images_per_count": min(per_count),
            "detectable_gap": minimum_detectable_gap(len(small), len(large), large_accuracy),
            "best_split": split.to_dict()}


def _style_text(t: dict) -> str:
    gap = ("no gap is detected with 80% power at these numbers" if t["detectable_gap"] is None else
           f"the test detects a gap of {t['detectable_gap']:.2f} or more with 80% power at these numbers")
    split = t["best_split"]
    return (f"{t['style']} ({t['images_per_count']} images per count): counts 1-{SMALL_COUNTS} "
            f"{format_share(t['small_accuracy'], t['small_n'])} vs >= {SMALL_COUNTS + 1} "
            f"{format_share(t['large_accuracy'], t['large_n'])}, one-sided Fisher {format_p(t['p_value'])} "
            f"(Holm over styles {format_p(t['p_holm'])}); {gap}; best split: counts <= {split['split']} "
            f"({split['small_accuracy']:.2f}) vs > {split['split']} ({split['large_accuracy']:.2f}), permutation "
            f"{format_p(split['p_value'])} over the choice among {len(split['z_per_split'])} splits")


def subitizing_finding(sections: Sequence[Section | None]) -> Finding:
    """F1 on every counting section (one per style: SynDot, SynPoly, ...), Holm-adjusted over the styles."""
    key, name, claim, test = SUBITIZING
    usable = [s for s in sections if s is not None and s.status == "ok" and "predictions" in s.data]
    if not usable:
        return _untested(key, name, claim, test, "the counting evaluation did not run")
    tests = [t for t in (_style_test(s) for s in usable) if t is not None]
    if not tests:
        return _untested(key, name, claim, test, f"the images have no counts on one side of {SMALL_COUNTS}")
    for t, adjusted in zip(tests, holm([t["p_value"] for t in tests]), strict=True):
        t["p_holm"] = adjusted
    shown_on = [t["style"] for t in tests if t["p_holm"] < LEVEL]
    shown = bool(shown_on)
    verdict = (f"small counts are answered more accurately on {', '.join(shown_on)}: shown." if shown else
               "no style shows a significant break between small and large counts: not shown.")
    evidence = "; ".join(_style_text(t) for t in tests) + ". " + verdict[:1].upper() + verdict[1:]
    return Finding(key, name, claim, test, shown, evidence, {"styles": tests, "shown_on": shown_on})


# ---------------------------------------------------------------------- 2. hand-off
HANDOFF = ("handoff", "VAP hand-off",
           "early layers carry the count in the image tokens; from a middle layer on it sits at the final prompt "
           "token (layers 1-14 vs 15-28 of Qwen2.5-VL-7B)",
           "the hand-off layer (first layer where patching the final position overwrites more often than patching "
           "the image tokens) exists in >= 97.5% of 1,000 bootstrap resamples of the pairs and its 95% interval "
           "lies after the first layer; before it, patching the image tokens overwrites some pairs, and from it "
           "on, patching the final position does (95% Wilson intervals above 0)")


def _rate_text(entry: Mapping | None, where: str) -> str:
    if not entry:
        return f"no layer {where}"
    return f"{entry['rate']:.2f} [{entry['low']:.2f}, {entry['high']:.2f}] at layer {entry['layer']}"


def handoff_finding(section: Section | None) -> Finding:
    key, name, claim, test = HANDOFF
    if section is None or section.status != "ok" or "handover" not in section.data:
        return _untested(key, name, claim, test, "the layer x region patching did not run")
    h = section.data["handover"]
    image, final = h.get("image_max_before"), h.get("final_max_after")
    exists = h["layer"] != "none"
    inside = exists and h["present_share"] >= 1 - LEVEL / 2 and h["low"] != "none" and h["low"] > h["first_layer"]
    image_carries = bool(image) and image["low"] > 0
    final_carries = bool(final) and final["low"] > 0
    shown = bool(inside and image_carries and final_carries)
    interval = f"{h['low']}-{h['high']}" if h["low"] != h["high"] else f"{h['low']}"
    parts = [f"Hand-off layer {h['layer']} (95% bootstrap interval over pairs: {interval}; present in "
             f"{h['present_share']:.0%} of {h['n_resamples']} resamples), layers {h['first_layer']}-{h['last_layer']}",
             f"largest image-token overwrite rate before it {_rate_text(image, 'before it')}",
             f"largest final-position rate from it on {_rate_text(final, 'from it on')}"]
    if shown:
        verdict = (f"the count moves from the image tokens to the final position at layer {h['layer']} (layers "
                   f"{h['first_layer']}-{h['last_layer']}): shown.")
    elif not exists:
        verdict = "patching the final position never overwrites more than patching the image: not shown."
    elif not inside:
        verdict = ("the hand-off is not pinned down after the first layer (it is absent from some resamples or may "
                   "sit at the first layer): not shown.")
    else:
        verdict = ("one side of the hand-off overwrites no pair beyond chance (a Wilson interval reaches 0): not "
                   "shown.")
    n_layers = h["last_layer"] - h["first_layer"] + 1
    caveat = ""
    if n_layers < MIN_BAND_LAYERS:
        caveat = (f"weak test: {n_layers} layers. Each half of this stack is {n_layers // 2} layer(s), so the test "
                  "shows whether the count moves from the image tokens to the final position, not that it does so "
                  f"in a middle band as in the paper's 28 layers (a band is read from {MIN_BAND_LAYERS} layers on)")
    return Finding(key, name, claim, test, shown, "; ".join(parts) + ": " + verdict, {**h, "n_layers": n_layers},
                   caveat)


# ---------------------------------------------------------------------- 3. late logit lens
LATE_LENS = ("late_logit_lens", "Late logit lens", "the true count appears only in late layers (rank 1 in the last "
             "two of 28)", "the first layer at which the true count is the top token for most images (95% Wilson "
             "interval of the share above 0.5) is in the upper half of the layers")


def late_lens_finding(section: Section | None) -> Finding:
    key, name, claim, test = LATE_LENS
    if section is None or section.status != "ok" or "top1_accuracy" not in section.data:
        return _untested(key, name, claim, test, "the logit lens did not run")
    shares = [float("nan") if s is None else float(s) for s in section.data["top1_accuracy"]]
    n = int(section.data["n_examples"])
    lows = [float(wilson_interval(round(s * n), n)[0]) if math.isfinite(s) else float("nan") for s in shares]
    first = next((layer for layer, low in enumerate(lows) if low > 0.5), None)
    n_layers = len(shares)
    shown = first is not None and first >= n_layers / 2
    before = (f"; at layer {first - 1} it is top for {format_share(shares[first - 1], n)}" if first else "")
    if first is None:
        evidence = (f"At no layer is the true count the top token for most of the {n} images (last layer: "
                    f"{format_share(shares[-1], n)}): not shown.")
    else:
        evidence = (f"The true count is first the top token for most images at layer {first} of {n_layers} "
                    f"({format_share(shares[first], n)}){before}: "
                    + ("it emerges in the upper half of the stack: shown." if shown else
                       "it emerges in the lower half of the stack: not shown."))
    caveat = ""
    if n_layers < MIN_BAND_LAYERS:
        caveat = (f"weak test: {n_layers} layers. 'The upper half' is layers {n_layers // 2}-{n_layers - 1}, so "
                  "'late' here is any of the last "
                  f"{n_layers - n_layers // 2} layers; the paper's 'last two of 28' (the top 7% of the stack) cannot "
                  f"be resolved at this depth (a band is read from {MIN_BAND_LAYERS} layers on)")
    return Finding(key, name, claim, test, shown, evidence, {"first_top_layer": first, "n_layers": n_layers,
                                                             "top1_share": shares, "n_examples": n}, caveat)


# ---------------------------------------------------------------------- 4. head classes
HEAD_CLASSES_FINDING = ("head_classes", "Four head classes",
                        "visual grounding, cross-modal routing, counting aggregation and awareness heads",
                        "every one of the four classes has at least one head whose class holds on >= 90% of 200 "
                        "bootstrap resamples of the examples, and the 95% interval of its head count excludes 0")


def class_testability(section: Section, model: Section | None = None) -> dict[str, str]:
    """Paper classes that cannot fire on this model -> why (measured, or read from its training record).

    - counting aggregation needs a head whose decoded output is the answer (answer_alignment above the
      threshold): if no head reaches it, the class cannot be identified by its rule on this model.
    - awareness fires on existence words (trained only if the model's data has existence questions) or
      on difficulty words ("difficult", "impossible", ...), which are never an answer in vlens's task
      suite: a model whose folder records a vlens training mix never learned to say them.
    """
    thresholds = section.data.get("thresholds") or {}
    heads = section.data.get("heads") or []
    out = {}
    alignment_min = thresholds.get("alignment_min")
    aligned = [(h["scores"].get("answer_alignment"), h) for h in heads if isinstance(h.get("scores"), Mapping)]
    aligned = [(float(v), h) for v, h in aligned if isinstance(v, (int, float)) and math.isfinite(v)]
    if alignment_min is not None and aligned:
        best, head = max(aligned, key=lambda pair: pair[0])
        if best < alignment_min:
            out["counting aggregation"] = (f"no head's decoded output is the answer often enough (answer alignment "
                                           f">= {alignment_min:g} needed; best L{head['layer']}H{head['head']} "
                                           f"{best:.2f}): no single head writes the answer")
    sources = None if model is None else model.data.get("training_sources")
    if sources is not None and not any(str(s).split("/")[0] == "existence" for s in sources):
        out["awareness"] = ("its data (recorded training mix: " + ", ".join(sources) + ") has no existence "
                            "questions and never answers with difficulty words, so neither awareness rule can fire")
    return out


def causal_head_classes(section: Section, ablation: Section | None, task: str = "counting") -> dict | None:
    """The taxonomy classes of the heads whose ablation hurts `task` most (the ablation stage's top-k)."""
    if ablation is None or ablation.status != "ok":
        return None
    result = (ablation.data.get("results") or {}).get(task)
    if not result or not result.get("top_heads"):
        return None
    top_k = int(ablation.data.get("top_k") or len(result["top_heads"]))
    by_head = {(h["layer"], h["head"]): h["class"] for h in section.data.get("heads") or []}
    top = [tuple(h) for h in result["top_heads"][:top_k]]
    classes = [by_head.get(h, "unscored") for h in top]
    return {"task": task, "heads": [f"L{layer}H{head}" for layer, head in top], "classes": classes,
            "per_class": {c: classes.count(c) for c in dict.fromkeys(classes)}}


def head_classes_finding(section: Section | None, ablation: Section | None = None,
                         model: Section | None = None) -> Finding:
    key, name, claim, test = HEAD_CLASSES_FINDING
    if section is None or section.status != "ok" or not section.data.get("stability"):
        return _untested(key, name, claim, test, "the HeadLens taxonomy did not run with a stability analysis")
    heads = section.data["heads"]
    intervals = section.data.get("counts_interval") or {}
    untestable = class_testability(section, model)
    per_class, parts = {}, []
    for cls in PAPER_CLASSES:
        members = [h for h in heads if h["class"] == cls]
        stable = [h for h in members if h.get("stable")]
        low, high = intervals.get(cls, [0, 0])
        ok = bool(stable) and low >= 1
        per_class[cls] = {"heads": len(members), "stable": len(stable), "count_interval": [low, high], "shown": ok,
                          "testable": cls not in untestable or ok}
        listed = ", ".join(f"L{h['layer']}H{h['head']} {h['stability']:.2f}" for h in members[:4])
        parts.append(f"{cls}: {len(members)} heads ({len(stable)} stable; count interval {low:g}-{high:g})"
                     + (f" [{listed}{', ...' if len(members) > 4 else ''}]" if members else "")
                     + (f" - cannot fire here: {untestable[cls]}" if cls in untestable and not ok else ""))
    causal = causal_head_classes(section, ablation)
    if causal is not None:
        parts.append(f"the {len(causal['heads'])} heads whose ablation hurts counting most are "
                     + ", ".join(f"{n} {c}" for c, n in causal["per_class"].items())
                     + f" ({', '.join(f'{h} {c}' for h, c in zip(causal['heads'], causal['classes'], strict=True))})")
    failed = [cls for cls, v in per_class.items() if v["testable"] and not v["shown"]]
    blocked = [cls for cls, v in per_class.items() if not v["testable"]]
    numbers = {**per_class, "causal_heads": causal, "untestable": {c: untestable[c] for c in blocked}}
    evidence = "; ".join(parts)
    if failed:
        return Finding(key, name, claim, test, False, evidence + ": " + (
            f"{', '.join(failed)} {'has' if len(failed) == 1 else 'have'} no stable head or a count interval "
            "reaching 0: not shown."), numbers)
    if blocked:
        return Finding(key, name, claim, test, None, evidence + f": every class that can fire here has a stable "
                       f"head, but {', '.join(blocked)} cannot fire on this model: not testable.", numbers,
                       testable=False)
    return Finding(key, name, claim, test, True, evidence + ": all four classes have a stable head: shown.", numbers)


# ---------------------------------------------------------------------- 5. interventions
INTERVENTIONS = ("interventions", "Interventions add up",
                 "+SFT, +L_focus and +beta each raise counting accuracy out of distribution (73.5 -> 79.8 -> 82.3 "
                 "-> 84.8 on SynReal for Qwen2.5-VL-7B)",
                 "on a counting set held out of both the SFT data and the model's own training, each step's accuracy "
                 "gain over the step before has a 95% interval above 0 (two-level bootstrap over seeds and the "
                 "paired images; a t interval over seeds where the study stores no per-image results)")


N_GAIN_RESAMPLES = 2000


def _source_of(eval_set: str) -> str:
    """The training-mix source name of a study evaluation set ("synreal" -> "counting/synreal")."""
    return f"counting/{eval_set}" if eval_set in ("synreal", "syndot", "synpoly") else eval_set


def paired_gain_interval(before: list[list[int]], after: list[list[int]], seed: int = 0,
                         n_resamples: int = N_GAIN_RESAMPLES) -> dict:
    """Mean accuracy gain (after - before) with a two-level percentile bootstrap: seeds resampled,
    then the (paired) images, so the interval carries both training and image sampling.

    before / after: per seed, 0 / 1 per image, the same images in the same order in both.
    """
    a = torch.tensor(before, dtype=torch.float64)
    b = torch.tensor(after, dtype=torch.float64)
    if a.shape != b.shape or a.ndim != 2 or a.numel() == 0:
        raise UserInputError(f"paired per-image results need equal [seeds, images] shapes, got {tuple(a.shape)} and "
                         f"{tuple(b.shape)}")
    gains = b - a  # [seeds, images]
    n_seeds, n_images = gains.shape
    generator = torch.Generator().manual_seed(seed)
    seeds = torch.randint(n_seeds, (n_resamples, n_seeds), generator=generator)
    images = torch.randint(n_images, (n_resamples, n_images), generator=generator)
    draws = gains[seeds[:, :, None], images[:, None, :]].mean(dim=(1, 2))
    low, high = torch.quantile(draws, torch.tensor([0.025, 0.975], dtype=torch.float64)).tolist()
    return {"mean": float(gains.mean()), "low": low, "high": high, "n": n_seeds, "n_images": n_images,
            "method": f"two-level percentile bootstrap (seeds, then images; {n_resamples} resamples)"}


def interventions_finding(section: Section | None, model: Section | None = None) -> Finding:
    key, name, claim, test = INTERVENTIONS
    if section is None or section.status != "ok":
        return _untested(key, name, claim, test, "no interventions study is stored with this model")
    if section.data.get("weights_match") is False:
        return _untested(key, name, claim, test, "the stored study was measured on other weights than these")
    raw = section.data.get("stored")
    if not (isinstance(raw, Mapping) and isinstance(raw.get("settings"), Mapping)
            and isinstance(raw.get("results"), Mapping)):
        return _untested(key, name, claim, test, "the stored table has no per-seed results")
    conditions = list(raw["settings"].get("conditions", []))
    roles = raw.get("set_roles") or {}
    outside_sft = [s for s in raw["settings"].get("eval_sets", []) if "not in the SFT data" in str(roles.get(s, ""))]
    if len(conditions) < 2 or not outside_sft:
        return _untested(key, name, claim, test, "the study has no held-out counting set or fewer than two conditions")
    trained = None if model is None else model.data.get("training_sources")
    held_out = [s for s in outside_sft if trained is None or _source_of(s) not in trained]
    if not held_out:
        return _untestable(key, name, claim, test, f"{', '.join(outside_sft)} {'is' if len(outside_sft) == 1 else 'are'}"
                           " outside the SFT data but inside the model's own training mix ("
                           + ", ".join(_source_of(s) for s in outside_sft) + " in its recorded training sources), so "
                           "no evaluation set is held out of both", {"outside_sft": outside_sft, "trained": trained})
    labels = raw.get("labels") or {}
    target = held_out[0]
    runs = list(raw["results"].values())
    per_image = all(isinstance(rows.get(c, {}).get(target, {}).get("correct"), list) for rows in runs for c in conditions)
    steps, parts = {}, []
    for before, after in zip(conditions, conditions[1:], strict=False):
        if per_image:
            stats = paired_gain_interval([rows[before][target]["correct"] for rows in runs],
                                         [rows[after][target]["correct"] for rows in runs])
        else:
            gains = [rows.get(after, {}).get(target, {}).get("accuracy", float("nan"))
                     - rows.get(before, {}).get(target, {}).get("accuracy", float("nan")) for rows in runs]
            stats = mean_interval([g for g in gains if math.isfinite(g)])
        ok = stats["n"] >= 2 and stats["low"] > 0
        label = f"{labels.get(after, after)} vs {labels.get(before, before)}"
        steps[label] = {**stats, "shown": ok}
        interval = "" if stats["n"] < 2 else f" [{100 * stats['low']:+.1f}, {100 * stats['high']:+.1f}]"
        parts.append(f"{label}: {100 * stats['mean']:+.1f} points{interval} over {stats['n']} seeds"
                     + (f" x {stats['n_images']} images" if per_image else "") + (" (shown)" if ok else " (not shown)"))
    shown = bool(steps) and all(v["shown"] for v in steps.values())
    failed = [label for label, v in steps.items() if not v["shown"]]
    verdict = ("every step raises accuracy: shown." if shown else
               f"{'; '.join(failed)}: no gain above 0, so not shown.")
    caveats = []
    if not per_image:
        caveats.append("interval over seeds only: the stored study has no per-image results, so image sampling is "
                       "not in it (rerun `vlens study`)")
    if trained is None:
        caveats.append("the model's own training data is not recorded, so the set is held out of the SFT data only")
    return Finding(key, name, claim, test, shown, f"Accuracy on {target} (held out of the SFT data"
                   + ("" if trained is None else " and of the model's training") + "): " + "; ".join(parts) + ": "
                   + verdict, {"set": target, "steps": steps, "per_image": per_image}, "; ".join(caveats))


# ---------------------------------------------------------------------- 6. Jaccard ordering
JACCARD = ("jaccard_ordering", "Counting shares heads with reasoning",
           "counting's top heads overlap math reasoning (0.38) and spatial relations (0.33) more than colour "
           "(0.18)",
           "on both samples: J(counting, arithmetic) and J(counting, spatial) above chance (Holm-adjusted p < 0.05 "
           "against two random top-k sets) and both larger than J(counting, colour); a comparison is made only "
           "between tasks the model answers above chance (95% Wilson interval of its accuracy above the share of "
           "its most frequent answer)")


def task_above_chance(result: Mapping) -> dict:
    """Whether a task's unablated accuracy beats always giving its most frequent answer (95% Wilson
    interval above that share); `result` is one task of the ablation section's data["results"]."""
    n = int(result["n_examples"])
    accuracy = float(result["clean_accuracy"])
    answers = [str(a).strip().lower() for a in (result.get("answers") or [])]
    majority = max(answers.count(a) for a in set(answers)) / len(answers) if answers else 0.0
    low, high = (float(v) for v in wilson_interval(round(accuracy * n), n))
    return {"accuracy": accuracy, "low": low, "high": high, "n": n, "majority_share": majority,
            "above_chance": low > majority}


# the finding's comparisons, each needing its tasks above chance: (description, tasks, rule on (values, p))
JACCARD_CHECKS = (
    ("J(counting, arithmetic) above chance", ("arithmetic",), lambda v, p: p("arithmetic") < LEVEL),
    ("J(counting, spatial) above chance", ("spatial",), lambda v, p: p("spatial") < LEVEL),
    ("J(counting, arithmetic) > J(counting, colour)", ("arithmetic", "colour"),
     lambda v, p: v("arithmetic") > v("colour")),
    ("J(counting, spatial) > J(counting, colour)", ("spatial", "colour"), lambda v, p: v("spatial") > v("colour")),
)


def jaccard_finding(section: Section | None) -> Finding:
    key, name, claim, test = JACCARD
    if section is None or section.status != "ok" or "jaccard" not in section.data:
        return _untested(key, name, claim, test, "the ablation study did not run")
    data = section.data
    tasks = list(data["tasks"])
    needed = ("counting", "arithmetic", "spatial", "colour")
    absent = [t for t in needed if t not in tasks]
    if absent or not data.get("retest_jaccard"):
        return _untested(key, name, claim, test, f"the ablation tasks lack {', '.join(absent)}" if absent
                         else "there is no second sample")
    chance = {t: task_above_chance(data["results"][t]) for t in needed if t in (data.get("results") or {})}
    at_chance = [t for t in needed if t in chance and not chance[t]["above_chance"]]
    chance_text = "; ".join(f"{t} accuracy {c['accuracy']:.2f} [{c['low']:.2f}, {c['high']:.2f}] vs its most "
                            f"frequent answer {c['majority_share']:.2f}" for t, c in chance.items() if t in at_chance)
    checks_kept = [c for c in JACCARD_CHECKS if not set(c[1]) & set(at_chance)]
    if "counting" in at_chance or not checks_kept:
        return _untestable(key, name, claim, test, f"its heads rank tasks the model answers at chance ({chance_text}),"
                           " so their top-head sets are noise", {"chance": chance, "at_chance": at_chance})
    i = {t: tasks.index(t) for t in needed}
    samples = {"first": (data["jaccard"]["matrix"], data["jaccard_p_value_holm"]),
               "second": (data["retest_jaccard"]["matrix"], data["retest_jaccard"]["p_value_holm"])}
    checks, parts = {}, []
    for sample, (matrix, holm_p) in samples.items():
        row = i["counting"]

        def value(task: str, m=matrix, r=row) -> float:
            v = m[r][i[task]]
            return float("nan") if v is None else float(v)

        def p(task: str, q=holm_p, r=row) -> float:
            v = q[r][i[task]]
            return float("nan") if v is None else float(v)

        checks[sample] = all(rule(value, p) for _, _, rule in checks_kept)
        parts.append(f"sample {1 if sample == 'first' else 2}: arithmetic {value('arithmetic'):.2f} (Holm p "
                     f"{p_number(p('arithmetic'))}), spatial {value('spatial'):.2f} (p {p_number(p('spatial'))}), "
                     f"colour {value('colour'):.2f} (p {p_number(p('colour'))})")
    shown = all(checks.values())
    verdict = ("the ordering holds above chance on both samples: shown." if shown else
               "the ordering does not hold above chance on both samples: not shown.")
    caveat = ""
    if at_chance:
        dropped = [c[0] for c in JACCARD_CHECKS if c not in checks_kept]
        caveat = (f"partial test: {', '.join(at_chance)} answered at chance ({chance_text}), so "
                  f"{'; '.join(dropped)} {'is' if len(dropped) == 1 else 'are'} left out")
    return Finding(key, name, claim, test, shown, "J(counting, task) " + "; ".join(parts) + ": " + verdict,
                   {"samples": checks, "chance": data["jaccard"].get("chance"), "task_chance": chance,
                    "at_chance": at_chance, "checks": [c[0] for c in checks_kept]}, caveat)


# ---------------------------------------------------------------------- the section
def paper_findings(sections: list[Section]) -> list[Finding]:
    """The six findings, tested on the sections' results (by section key)."""
    by_key = {s.key: s for s in sections}
    counting = [s for s in sections if s.key.startswith("counting_accuracy")]
    return [subitizing_finding(counting), handoff_finding(by_key.get("vap_layer_region")),
            late_lens_finding(by_key.get("logit_lens")),
            head_classes_finding(by_key.get("headlens"), by_key.get("ablation_jaccard"), by_key.get("model")),
            interventions_finding(by_key.get("interventions"), by_key.get("model")), jaccard_finding(by_key.get("ablation_jaccard"))]


def untested_by_verdict(findings: list[Finding]) -> list[tuple[str, list[str]]]:
    """(verdict, finding names) for the findings not tested here, "not testable on this model" (the
    test cannot come out either way) apart from "not tested" (its stage or data missing)."""
    groups: dict[str, list[str]] = {}
    for finding in findings:
        if finding.shown is None:
            groups.setdefault(finding.verdict, []).append(finding.name)
    return list(groups.items())


def findings_section(sections: list[Section]) -> Section:
    """One row per finding: the paper's claim, shown / not shown / not tested here, the test, the evidence."""
    findings = paper_findings(sections)
    tested = [f for f in findings if f.shown is not None]
    shown = [f for f in tested if f.shown]
    explanation = (f"Each of the paper's findings is tested on this model's results below (level {LEVEL}, 95% "
                   f"intervals): {len(shown)} of {len(tested)} tested findings are shown"
                   + (f" ({', '.join(f.name for f in shown)})" if shown else "")
                   + "".join(f"; {verdict}: {', '.join(names)}" for verdict, names in untested_by_verdict(findings))
                   + ". A finding whose test fails is \"not shown\", with the numbers and p-values that decided it.")
    items = "".join(f"<li><b>{html.escape(f.name)}: {html.escape(f.verdict)}.</b> {html.escape(f.evidence)}"
                    + (f" <i>Caveat: {html.escape(f.caveat)}.</i>" if f.caveat else "") + "</li>"
                    for f in findings)
    return Section(
        key="findings", title=TITLE, explanation=explanation, html=f'<ul class="findings">{items}</ul>',
        table=[{"finding": f.name, "on this model": f.verdict + (f" ({f.caveat.split('.')[0]})" if f.caveat else ""),
                "the paper": f.claim, "test": f.test} for f in findings],
        numbers={f.name: f.verdict for f in findings},
        data={"findings": [f.to_dict() for f in findings], "level": LEVEL},
    )


def findings_lines(section: Section) -> list[str]:
    """The findings section's verdicts, one line each (``name: verdict``), for the terminal."""
    findings = section.data.get("findings", [])
    return [f"{TITLE} ({len(findings)}):"] + [
        f"  {f['name']}: {f['verdict']}" + (f" ({f['caveat'].split('.')[0]})" if f.get("caveat") else "")
        for f in findings]


__all__ = ["Finding", "findings_lines", "findings_section", "paper_findings"]

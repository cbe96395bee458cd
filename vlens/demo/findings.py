"""The paper's six findings on the model under study: each shown or not shown by an explicit test.

Every verdict and every number in the statements is computed from the other sections' results
(their `data`, as results.json holds it); only the paper's claim and the rule of each test are
fixed text. A test whose stage did not run, or whose data lacks what it needs, is "not tested"
with the reason. Level: 0.05 for p-values, 95% intervals.

1. subitizing: counts 1-4 are answered more accurately than counts >= 5 (one-sided Fisher exact test).
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
from collections.abc import Mapping
from dataclasses import dataclass, field

from vlens.demo.report_sections import Section
from vlens.utils.stats import fisher_greater, format_p, format_share, mean_interval, p_number, wilson_interval

LEVEL = 0.05
SMALL_COUNTS = 4  # the paper's subitizing range: 1-4
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

    @property
    def verdict(self) -> str:
        return {True: "shown", False: "not shown", None: "not tested"}[self.shown]

    def to_dict(self) -> dict:
        return {"key": self.key, "name": self.name, "claim": self.claim, "test": self.test, "shown": self.shown,
                "verdict": self.verdict, "evidence": self.evidence, "numbers": self.numbers}


def _untested(key: str, name: str, claim: str, test: str, why: str) -> Finding:
    return Finding(key, name, claim, test, None, f"Not tested: {why}.")


# ---------------------------------------------------------------------- 1. subitizing
SUBITIZING = ("subitizing", "Subitizing", "small counts (1-4) are counted reliably, larger ones degrade",
              f"counts 1-{SMALL_COUNTS} vs counts >= {SMALL_COUNTS + 1}: one-sided Fisher exact test that the "
              f"small counts are answered more accurately, p < {LEVEL}")


def subitizing_finding(section: Section | None) -> Finding:
    key, name, claim, test = SUBITIZING
    if section is None or section.status != "ok" or "predictions" not in section.data:
        return _untested(key, name, claim, test, "the counting evaluation did not run")
    predictions = section.data["predictions"]
    groups = {"small": [p for p in predictions if p["target"] <= SMALL_COUNTS],
              "large": [p for p in predictions if p["target"] > SMALL_COUNTS]}
    if not groups["small"] or not groups["large"]:
        return _untested(key, name, claim, test, f"the images have no counts on one side of {SMALL_COUNTS}")
    hits = {g: sum(bool(p["correct"]) for p in rows) for g, rows in groups.items()}
    n = {g: len(rows) for g, rows in groups.items()}
    p_value = fisher_greater(hits["small"], n["small"], hits["large"], n["large"])
    per_count = {c: a for c, a in zip(section.data["counts"], section.data["accuracy_per_count"], strict=True)}
    counts = sorted(per_count)
    drops = [(per_count[a] - per_count[b], a, b) for a, b in zip(counts, counts[1:], strict=False)]
    drop = max(drops) if drops else None
    shown = p_value < LEVEL
    small_text = format_share(hits["small"] / n["small"], n["small"])
    large_text = format_share(hits["large"] / n["large"], n["large"])
    where = (f"; the largest drop between consecutive counts is {drop[1]} -> {drop[2]} ({per_count[drop[1]]:.2f} -> "
             f"{per_count[drop[2]]:.2f})" if drop and drop[0] > 0 else "; accuracy never drops from one count to "
             "the next")
    evidence = (f"Accuracy on counts 1-{SMALL_COUNTS}: {small_text} ({n['small']} images); on counts >= "
                f"{SMALL_COUNTS + 1}: {large_text} ({n['large']} images); one-sided Fisher exact {format_p(p_value)}"
                f"{where}. " + ("Small counts are answered more accurately: shown." if shown else
                                f"No significant break between small and large counts: not shown ({format_p(p_value)})."))
    return Finding(key, name, claim, test, shown, evidence,
                   {"small_accuracy": hits["small"] / n["small"], "small_n": n["small"],
                    "large_accuracy": hits["large"] / n["large"], "large_n": n["large"], "p_value": p_value})


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
    return Finding(key, name, claim, test, shown, "; ".join(parts) + ": " + verdict, dict(h))


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
    return Finding(key, name, claim, test, shown, evidence, {"first_top_layer": first, "n_layers": n_layers,
                                                             "top1_share": shares, "n_examples": n})


# ---------------------------------------------------------------------- 4. head classes
HEAD_CLASSES_FINDING = ("head_classes", "Four head classes",
                        "visual grounding, cross-modal routing, counting aggregation and awareness heads",
                        "every one of the four classes has at least one head whose class holds on >= 90% of 200 "
                        "bootstrap resamples of the examples, and the 95% interval of its head count excludes 0")


def head_classes_finding(section: Section | None) -> Finding:
    key, name, claim, test = HEAD_CLASSES_FINDING
    if section is None or section.status != "ok" or not section.data.get("stability"):
        return _untested(key, name, claim, test, "the HeadLens taxonomy did not run with a stability analysis")
    heads = section.data["heads"]
    intervals = section.data.get("counts_interval") or {}
    per_class, parts = {}, []
    for cls in PAPER_CLASSES:
        members = [h for h in heads if h["class"] == cls]
        stable = [h for h in members if h.get("stable")]
        low, high = intervals.get(cls, [0, 0])
        ok = bool(stable) and low >= 1
        per_class[cls] = {"heads": len(members), "stable": len(stable), "count_interval": [low, high], "shown": ok}
        listed = ", ".join(f"L{h['layer']}H{h['head']} {h['stability']:.2f}" for h in members[:4])
        parts.append(f"{cls}: {len(members)} heads ({len(stable)} stable; count interval {low:g}-{high:g})"
                     + (f" [{listed}{', ...' if len(members) > 4 else ''}]" if members else ""))
    shown = all(v["shown"] for v in per_class.values())
    missing = [cls for cls, v in per_class.items() if not v["shown"]]
    verdict = ("all four classes have a stable head: shown." if shown else
               f"{', '.join(missing)} {'has' if len(missing) == 1 else 'have'} no stable head or a count interval "
               "reaching 0: not shown.")
    return Finding(key, name, claim, test, shown, "; ".join(parts) + ": " + verdict, per_class)


# ---------------------------------------------------------------------- 5. interventions
INTERVENTIONS = ("interventions", "Interventions add up",
                 "+SFT, +L_focus and +beta each raise counting accuracy out of distribution (73.5 -> 79.8 -> 82.3 "
                 "-> 84.8 on SynReal for Qwen2.5-VL-7B)",
                 "on the held-out counting set, each step's accuracy gain over the step before has a 95% t interval "
                 "across seeds above 0")


def interventions_finding(section: Section | None) -> Finding:
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
    held_out = [s for s in raw["settings"].get("eval_sets", []) if "not in the SFT data" in str(roles.get(s, ""))]
    if len(conditions) < 2 or not held_out:
        return _untested(key, name, claim, test, "the study has no held-out counting set or fewer than two conditions")
    labels = raw.get("labels") or {}
    target = held_out[0]
    steps, parts = {}, []
    for before, after in zip(conditions, conditions[1:], strict=False):
        gains = []
        for rows in raw["results"].values():
            a, b = rows.get(before, {}).get(target, {}), rows.get(after, {}).get(target, {})
            if isinstance(a.get("accuracy"), (int, float)) and isinstance(b.get("accuracy"), (int, float)):
                gains.append(b["accuracy"] - a["accuracy"])
        stats = mean_interval(gains)
        ok = stats["n"] >= 2 and stats["low"] > 0
        label = f"{labels.get(after, after)} vs {labels.get(before, before)}"
        steps[label] = {**stats, "shown": ok}
        interval = ("" if stats["n"] < 2 else
                    f" [{100 * stats['low']:+.1f}, {100 * stats['high']:+.1f}]")
        parts.append(f"{label}: {100 * stats['mean']:+.1f} points{interval} over {stats['n']} seeds"
                     + (" (shown)" if ok else " (not shown)"))
    shown = bool(steps) and all(v["shown"] for v in steps.values())
    failed = [label for label, v in steps.items() if not v["shown"]]
    verdict = ("every step raises accuracy: shown." if shown else
               f"{'; '.join(failed)}: no gain above 0 across seeds, so not shown.")
    return Finding(key, name, claim, test, shown, f"Accuracy on {target} (held out): " + "; ".join(parts) + ": "
                   + verdict, {"set": target, "steps": steps})


# ---------------------------------------------------------------------- 6. Jaccard ordering
JACCARD = ("jaccard_ordering", "Counting shares heads with reasoning",
           "counting's top heads overlap math reasoning (0.38) and spatial relations (0.33) more than colour "
           "(0.18)",
           "on both samples: J(counting, arithmetic) and J(counting, spatial) above chance (Holm-adjusted p < 0.05 "
           "against two random top-k sets) and both larger than J(counting, colour)")


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
    i = {t: tasks.index(t) for t in needed}
    samples = {"first": (data["jaccard"]["matrix"], data["jaccard_p_value_holm"]),
               "second": (data["retest_jaccard"]["matrix"], data["retest_jaccard"]["p_value_holm"])}
    checks, parts = {}, []
    for sample, (matrix, holm) in samples.items():
        row = i["counting"]

        def value(task: str, m=matrix, r=row) -> float:
            v = m[r][i[task]]
            return float("nan") if v is None else float(v)

        def p(task: str, q=holm, r=row) -> float:
            v = q[r][i[task]]
            return float("nan") if v is None else float(v)

        ok = (p("arithmetic") < LEVEL and p("spatial") < LEVEL
              and value("arithmetic") > value("colour") and value("spatial") > value("colour"))
        checks[sample] = ok
        parts.append(f"sample {1 if sample == 'first' else 2}: arithmetic {value('arithmetic'):.2f} (Holm p "
                     f"{p_number(p('arithmetic'))}), spatial {value('spatial'):.2f} (p {p_number(p('spatial'))}), "
                     f"colour {value('colour'):.2f} (p {p_number(p('colour'))})")
    shown = all(checks.values())
    verdict = ("the ordering holds above chance on both samples: shown." if shown else
               "the ordering does not hold above chance on both samples: not shown.")
    return Finding(key, name, claim, test, shown, "J(counting, task) " + "; ".join(parts) + ": " + verdict,
                   {"samples": checks, "chance": data["jaccard"].get("chance")})


# ---------------------------------------------------------------------- the section
def paper_findings(sections: list[Section]) -> list[Finding]:
    """The six findings, tested on the sections' results (by section key)."""
    by_key = {s.key: s for s in sections}
    return [subitizing_finding(by_key.get("counting_accuracy")), handoff_finding(by_key.get("vap_layer_region")),
            late_lens_finding(by_key.get("logit_lens")), head_classes_finding(by_key.get("headlens")),
            interventions_finding(by_key.get("interventions")), jaccard_finding(by_key.get("ablation_jaccard"))]


def findings_section(sections: list[Section]) -> Section:
    """One row per finding: the paper's claim, shown / not shown / not tested here, the test, the evidence."""
    findings = paper_findings(sections)
    tested = [f for f in findings if f.shown is not None]
    shown = [f for f in tested if f.shown]
    explanation = (f"Each of the paper's findings is tested on this model's results below (level {LEVEL}, 95% "
                   f"intervals): {len(shown)} of {len(tested)} tested findings are shown"
                   + (f" ({', '.join(f.name for f in shown)})" if shown else "")
                   + (f"; not tested: {', '.join(f.name for f in findings if f.shown is None)}"
                      if len(tested) < len(findings) else "")
                   + ". A finding whose test fails is \"not shown\", with the numbers and p-values that decided it.")
    items = "".join(f"<li><b>{html.escape(f.name)}: {html.escape(f.verdict)}.</b> {html.escape(f.evidence)}</li>"
                    for f in findings)
    return Section(
        key="findings", title=TITLE, explanation=explanation, html=f'<ul class="findings">{items}</ul>',
        table=[{"finding": f.name, "on this model": f.verdict, "the paper": f.claim, "test": f.test} for f in findings],
        numbers={f.name: f.verdict for f in findings},
        data={"findings": [f.to_dict() for f in findings], "level": LEVEL},
    )


def findings_lines(section: Section) -> list[str]:
    """The findings section's verdicts, one line each (``name: verdict``), for the terminal."""
    findings = section.data.get("findings", [])
    return [f"{TITLE} ({len(findings)}):"] + [f"  {f['name']}: {f['verdict']}" for f in findings]


__all__ = ["Finding", "findings_lines", "findings_section", "paper_findings"]

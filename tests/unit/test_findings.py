"""The demo's statements of the paper's findings: each verdict follows its test on hand-made results,
and the hand-off layer's bootstrap on a hand-made patching sweep."""

from __future__ import annotations

import pytest
import torch

from vlens.demo.findings import (
    Finding,
    findings_lines,
    findings_section,
    handoff_finding,
    head_classes_finding,
    interventions_finding,
    jaccard_finding,
    late_lens_finding,
    subitizing_finding,
    untested_by_verdict,
)
from vlens.demo.patching_stage import handover_bootstrap
from vlens.demo.report_sections import Section
from vlens.patching.metrics import Baseline
from vlens.patching.results import PatchingResult


def _counting(accuracy: dict[int, float], n: int = 20, style: str = "syndot") -> Section:
    predictions = [{"target": c, "correct": i < round(a * n)} for c, a in accuracy.items() for i in range(n)]
    key = "counting_accuracy" if style == "syndot" else f"counting_accuracy_{style}"
    return Section(key, "t", "e", data={"style": style, "counts": list(accuracy), "predictions": predictions,
                                        "accuracy_per_count": list(accuracy.values())})


def test_subitizing_is_shown_only_when_small_counts_beat_large_ones_significantly():
    broken = subitizing_finding([_counting({1: 1.0, 2: 1.0, 3: 1.0, 4: 0.95, 5: 0.6, 6: 0.5, 7: 0.4})])
    style = broken.numbers["styles"][0]
    assert broken.shown is True and style["p_value"] < 1e-6 and broken.numbers["shown_on"] == ["syndot"]
    assert style["best_split"]["split"] == 4 and style["best_split"]["p_value"] < 0.01
    assert style["images_per_count"] == 20 and "80% power" in broken.evidence
    flat = subitizing_finding([_counting({1: 1.0, 2: 1.0, 3: 1.0, 4: 1.0, 5: 1.0, 6: 1.0, 7: 0.95})])
    assert flat.shown is False and "not shown" in flat.evidence
    assert subitizing_finding([None]).verdict == "not tested" and subitizing_finding([]).verdict == "not tested"


def test_subitizing_is_tested_on_each_style_with_holm_over_styles():
    # SynDot flat, SynPoly breaking after 3: shown on synpoly only, the best split found at 3 there
    dots = _counting({c: 1.0 for c in range(1, 9)}, style="syndot")
    polys = _counting({1: 1.0, 2: 1.0, 3: 0.95, 4: 0.5, 5: 0.4, 6: 0.4, 7: 0.3, 8: 0.3}, style="synpoly")
    finding = subitizing_finding([dots, polys])
    assert finding.shown is True and finding.numbers["shown_on"] == ["synpoly"]
    by_style = {t["style"]: t for t in finding.numbers["styles"]}
    assert by_style["synpoly"]["best_split"]["split"] == 3
    p = [by_style[s]["p_value"] for s in ("syndot", "synpoly")]
    assert by_style["synpoly"]["p_holm"] == pytest.approx(min(1.0, 2 * min(p)))  # Holm's first step


def _handover(**values) -> Section:
    h = {"layer": 3, "low": 2, "high": 3, "present_share": 1.0, "n_resamples": 1000, "level": 0.95,
         "image_max_before": {"layer": 0, "rate": 0.9, "low": 0.7, "high": 0.97},
         "final_max_after": {"layer": 3, "rate": 0.9, "low": 0.7, "high": 0.97}, "first_layer": 0, "last_layer": 3}
    h.update(values)
    return Section("vap_layer_region", "t", "e", data={"handover": h})


def test_handoff_needs_a_pinned_layer_after_the_first_and_both_sides_carrying_the_count():
    assert handoff_finding(_handover()).shown is True
    assert handoff_finding(_handover(present_share=0.9)).shown is False  # absent from 10% of resamples
    assert handoff_finding(_handover(low=0)).shown is False  # may sit at the first layer
    silent = {"layer": 0, "rate": 0.05, "low": 0.0, "high": 0.2}
    assert handoff_finding(_handover(image_max_before=silent)).shown is False  # image tokens never matter
    none = handoff_finding(_handover(layer="none", low="none", high="none", present_share=0.0))
    assert none.shown is False and "never overwrites more" in none.evidence


def _patching_sweep(image_hits: list[list[int]], final_hits: list[list[int]]) -> PatchingResult:
    """A layer x region sweep with known per-pair predictions: clean answer token 0, corrupt token 1;
    a hit means the patched run predicts the corrupt answer (an overwrite)."""
    n_layers, n_pairs = len(image_hits), len(image_hits[0])
    logits = torch.tensor([[5.0, 0.0]]).repeat(n_pairs, 1)
    baseline = Baseline(logits, logits.flip(-1), torch.zeros(n_pairs, dtype=torch.long),
                        torch.ones(n_pairs, dtype=torch.long))
    prediction = torch.tensor([image_hits, final_hits]).permute(1, 0, 2)  # [layers, regions, pairs]
    rates = prediction.double().mean(-1).float()
    return PatchingResult(mode="layer-region", component="resid_pre", layers=list(range(n_layers)),
                          cells=["image", "final"], metrics={"overwrite_rate": rates},
                          per_pair={"logit_diff": prediction.float(), "prediction": prediction},
                          pair_ids=[f"p{i}" for i in range(n_pairs)], baseline=baseline)


def test_handover_bootstrap_on_a_known_sweep():
    # image tokens overwrite every pair at layers 0-1, the final position every pair from layer 2
    sharp = _patching_sweep([[1] * 8, [1] * 8, [0] * 8, [0] * 8], [[0] * 8, [0] * 8, [1] * 8, [1] * 8])
    h = handover_bootstrap(sharp, n_resamples=200)
    assert (h["layer"], h["low"], h["high"], h["present_share"]) == (2, 2, 2, 1.0)
    assert h["image_max_before"]["layer"] == 0 and h["final_max_after"]["low"] > 0.6
    assert handoff_finding(Section("vap_layer_region", "t", "e", data={"handover": h})).shown is True
    # at layer 2 the final position wins on 2 of 8 pairs only (no pair drawn: 10% of resamples)
    blurred = _patching_sweep([[1] * 8, [1] * 8, [0] * 8, [0] * 8],
                              [[0] * 8, [0] * 8, [1, 1, 0, 0, 0, 0, 0, 0], [0] * 8])
    h = handover_bootstrap(blurred, n_resamples=300)
    assert h["layer"] == 2 and 0.8 < h["present_share"] < 1.0 and h["high"] == "none"
    assert handoff_finding(Section("vap_layer_region", "t", "e", data={"handover": h})).shown is False


def test_late_logit_lens():
    late = Section("logit_lens", "t", "e", data={"top1_accuracy": [0.0, 0.1, 0.3, 0.95], "n_examples": 100})
    assert late_lens_finding(late).shown is True and "layer 3 of 4" in late_lens_finding(late).evidence
    early = Section("logit_lens", "t", "e", data={"top1_accuracy": [0.9, 0.95, 0.97, 0.99], "n_examples": 100})
    assert late_lens_finding(early).shown is False
    never = Section("logit_lens", "t", "e", data={"top1_accuracy": [0.0, 0.1, 0.3, 0.55], "n_examples": 40})
    assert late_lens_finding(never).shown is False  # 0.55 of 40: its interval reaches below 0.5


def test_a_shallow_model_gets_a_caveat_on_the_depth_findings():
    late = late_lens_finding(Section("logit_lens", "t", "e", data={"top1_accuracy": [0.0, 0.1, 0.3, 0.95],
                                                                   "n_examples": 100}))
    assert late.caveat.startswith("weak test: 4 layers. 'The upper half' is layers 2-3")
    deep = late_lens_finding(Section("logit_lens", "t", "e", data={"top1_accuracy": [0.0] * 6 + [0.9, 0.99],
                                                                   "n_examples": 100}))
    assert deep.shown is True and deep.caveat == ""  # 8 layers: the band is read
    assert handoff_finding(_handover()).caveat.startswith("weak test: 4 layers. Each half of this stack is 2")
    assert handoff_finding(_handover(last_layer=9)).caveat == ""
    lines = findings_lines(findings_section([Section("logit_lens", "t", "e", data={
        "top1_accuracy": [0.0, 0.1, 0.3, 0.95], "n_examples": 100})]))
    assert "  Late logit lens: shown (weak test: 4 layers)" in lines


def _taxonomy(classes: dict[str, list[tuple[float, bool]]], intervals: dict[str, list[float]]) -> Section:
    heads = [{"layer": i, "head": j, "class": name, "stability": s, "stable": ok}
             for i, (name, members) in enumerate(classes.items()) for j, (s, ok) in enumerate(members)]
    return Section("headlens", "t", "e", data={"heads": heads, "counts_interval": intervals,
                                                "stability": {"n_resamples": 200}})


def test_head_classes_need_a_stable_head_in_each_of_the_four():
    four = {"visual grounding": [(1.0, True)], "cross-modal routing": [(0.95, True), (0.5, False)],
            "counting aggregation": [(0.92, True)], "awareness": [(0.99, True)]}
    intervals = {name: [1, 3] for name in four}
    assert head_classes_finding(_taxonomy(four, intervals)).shown is True
    shaky = {**four, "awareness": [(0.6, False)]}
    finding = head_classes_finding(_taxonomy(shaky, intervals))
    assert finding.shown is False and "awareness has no stable head" in finding.evidence
    assert head_classes_finding(_taxonomy(four, {**intervals, "awareness": [0, 2]})).shown is False


def test_head_classes_that_cannot_fire_make_the_finding_not_testable_and_causal_heads_get_classes():
    three = {"visual grounding": [(1.0, True)], "cross-modal routing": [(0.95, True)],
             "counting aggregation": [], "awareness": [(0.99, True)]}
    section = _taxonomy(three, {"visual grounding": [1, 2], "cross-modal routing": [1, 2],
                                "counting aggregation": [0, 0], "awareness": [1, 1]})
    section.data["thresholds"] = {"alignment_min": 0.5}
    for h in section.data["heads"]:
        h["scores"] = {"answer_alignment": 0.04 * (1 + h["layer"])}  # best: layer 3 (awareness), 0.16
    ablation = Section("ablation_jaccard", "t", "e", data={"top_k": 2, "results": {
        "counting": {"top_heads": [[1, 0], [3, 0], [0, 0]]}}})
    finding = head_classes_finding(section, ablation)
    assert finding.verdict == "not testable on this model"
    assert "best L3H0 0.16" in finding.evidence and "no single head writes the answer" in finding.evidence
    assert finding.numbers["causal_heads"]["classes"] == ["cross-modal routing", "awareness"]  # the top 2
    # an aggregation head above the threshold exists but is unstable: testable, and not shown
    section.data["heads"][0]["scores"]["answer_alignment"] = 0.8
    assert head_classes_finding(section).shown is False
    # a vlens-trained model without existence questions: awareness cannot fire either
    four = {"visual grounding": [(1.0, True)], "cross-modal routing": [(0.95, True)],
            "counting aggregation": [(0.92, True)], "awareness": []}
    model = Section("model", "t", "e", data={"training_sources": ["colour", "counting/syndot"]})
    no_awareness = head_classes_finding(_taxonomy(four, {name: [1, 3] for name in four}), model=model)
    assert no_awareness.verdict == "not testable on this model"
    assert "has no existence questions" in no_awareness.evidence
    trained = Section("model", "t", "e", data={"training_sources": ["existence", "counting/syndot"]})
    assert head_classes_finding(_taxonomy(four, {name: [1, 3] for name in four}), model=trained).shown is False


def _study(gains: dict[str, list[float]]) -> Section:
    conditions = ["baseline", "sft", "sft_focus", "sft_focus_beta"]
    results = {}
    for seed in range(3):
        accuracy, rows = 0.5, {}
        for condition in conditions:
            accuracy += gains.get(condition, [0.0] * 3)[seed]
            rows[condition] = {"synreal": {"accuracy": accuracy}}
        results[str(seed)] = rows
    raw = {"settings": {"conditions": conditions, "eval_sets": ["synreal"]}, "results": results,
           "set_roles": {"synreal": "counting, not in the SFT data"}, "labels": {"sft": "+SFT"}}
    return Section("interventions", "t", "e", data={"stored": raw, "weights_match": True})


def test_each_intervention_must_gain_across_seeds():
    steady = _study({"sft": [0.05, 0.06, 0.07], "sft_focus": [0.02, 0.03, 0.025], "sft_focus_beta": [0.01, 0.012, 0.011]})
    assert interventions_finding(steady).shown is True
    mixed = _study({"sft": [0.05, 0.06, 0.07], "sft_focus": [-0.02, 0.03, 0.0], "sft_focus_beta": [0.01, 0.012, 0.011]})
    finding = interventions_finding(mixed)
    assert finding.shown is False and finding.numbers["steps"]["+SFT vs baseline"]["shown"] is True
    stale = _study({})
    stale.data["weights_match"] = False
    assert interventions_finding(stale).verdict == "not tested"
    assert "no per-image results" in interventions_finding(steady).caveat


def _per_image_study(hits: dict[str, list[list[int]]]) -> Section:
    """A study whose synreal set stores, per condition and seed, 0 / 1 per image."""
    conditions = list(hits)
    results = {str(seed): {c: {"synreal": {"accuracy": sum(hits[c][seed]) / len(hits[c][seed]),
                                           "correct": hits[c][seed]}} for c in conditions}
               for seed in range(len(hits[conditions[0]]))}
    raw = {"settings": {"conditions": conditions, "eval_sets": ["synreal"]}, "results": results,
           "set_roles": {"synreal": "counting, not in the SFT data"}}
    return Section("interventions", "t", "e", data={"stored": raw, "weights_match": True})


def test_the_interval_carries_image_sampling_and_held_out_means_out_of_the_models_training_too():
    # the same 3 images fixed by every seed: seeds agree perfectly, yet 3 images cannot pin the gain above 0
    few = _per_image_study({"baseline": [[0, 0, 1]] * 3, "sft": [[1, 0, 1]] * 3})
    finding = interventions_finding(few)
    step = finding.numbers["steps"]["sft vs baseline"]
    assert finding.numbers["per_image"] is True and step["mean"] == pytest.approx(1 / 3)
    assert step["low"] == 0.0 and finding.shown is False  # a t interval over the 3 identical seeds would be [1/3, 1/3]
    many = _per_image_study({"baseline": [[0] * 60 + [1] * 60] * 3, "sft": [[0] * 20 + [1] * 100] * 3})
    assert interventions_finding(many).shown is True and interventions_finding(many).caveat.startswith(
        "the model's own training data is not recorded")
    model = Section("model", "t", "e", data={"training_sources": ["counting/synreal", "colour"]})
    inside = interventions_finding(many, model)
    assert inside.verdict == "not testable on this model" and "inside the model's own training mix" in inside.evidence
    outside = interventions_finding(many, Section("model", "t", "e", data={"training_sources": ["colour"]}))
    assert outside.shown is True and outside.caveat == "" and "and of the model's training" in outside.evidence


def test_paired_gain_interval_by_hand():
    from vlens.demo.findings import paired_gain_interval

    same = paired_gain_interval([[1, 0, 1, 0]] * 2, [[1, 1, 1, 1]] * 2)
    assert same["mean"] == 0.5 and 0.0 <= same["low"] <= same["mean"] <= same["high"] <= 1.0
    with pytest.raises(ValueError, match="equal"):
        paired_gain_interval([[1, 0]], [[1, 0, 1]])


def _ablation(first: dict[str, tuple[float, float]], second: dict[str, tuple[float, float]]) -> Section:
    """tasks counting, arithmetic, spatial, colour; per sample {task: (J with counting, Holm p)}."""
    tasks = ["counting", "arithmetic", "spatial", "colour"]

    def grids(values):
        matrix = [[1.0 if a == b else 0.0 for b in tasks] for a in tasks]
        holm = [[None] * 4 for _ in tasks]
        for task, (j, p) in values.items():
            k = tasks.index(task)
            matrix[0][k] = matrix[k][0] = j
            holm[0][k] = holm[k][0] = p
        return matrix, holm

    (m1, p1), (m2, p2) = grids(first), grids(second)
    return Section("ablation_jaccard", "t", "e", data={"tasks": tasks, "jaccard": {"matrix": m1, "chance": 0.2},
                                                        "jaccard_p_value_holm": p1,
                                                        "retest_jaccard": {"matrix": m2, "p_value_holm": p2}})


def test_jaccard_ordering_must_hold_above_chance_on_both_samples():
    paper = {"arithmetic": (0.6, 0.001), "spatial": (0.5, 0.01), "colour": (0.1, 1.0)}
    assert jaccard_finding(_ablation(paper, paper)).shown is True
    flipped = {"arithmetic": (0.1, 1.0), "spatial": (0.5, 0.01), "colour": (0.6, 0.001)}
    assert jaccard_finding(_ablation(paper, flipped)).shown is False
    weak = {"arithmetic": (0.6, 0.2), "spatial": (0.5, 0.01), "colour": (0.1, 1.0)}  # not above chance
    finding = jaccard_finding(_ablation(paper, weak))
    assert finding.shown is False and "Holm p 0.20" in finding.evidence


def _with_accuracy(section: Section, accuracy: dict[str, float], n: int = 60) -> Section:
    """Each task's unablated accuracy on n examples whose answers are half "yes", half "no"."""
    section.data["results"] = {task: {"n_examples": n, "clean_accuracy": accuracy.get(task, 0.95),
                                      "answers": ["yes", "no"] * (n // 2)} for task in section.data["tasks"]}
    return section


def test_jaccard_comparisons_are_made_only_between_tasks_above_chance():
    paper = {"arithmetic": (0.6, 0.001), "spatial": (0.5, 0.01), "colour": (0.1, 1.0)}
    # spatial answered 0.55 on 60 examples of half "yes": its interval [0.42, 0.67] holds 0.5, so it is at chance
    partial = jaccard_finding(_with_accuracy(_ablation(paper, paper), {"spatial": 0.55}))
    assert partial.shown is True and partial.numbers["at_chance"] == ["spatial"]
    assert partial.numbers["checks"] == ["J(counting, arithmetic) above chance",
                                         "J(counting, arithmetic) > J(counting, colour)"]
    assert partial.caveat.startswith("partial test: spatial answered at chance (spatial accuracy 0.55")
    untestable = jaccard_finding(_with_accuracy(_ablation(paper, paper), {"counting": 0.5}))
    assert untestable.verdict == "not testable on this model" and "counting accuracy 0.50" in untestable.evidence
    colourless = jaccard_finding(_with_accuracy(_ablation(paper, paper), {"colour": 0.5, "spatial": 0.5}))
    assert colourless.numbers["checks"] == ["J(counting, arithmetic) above chance"]
    assert jaccard_finding(_with_accuracy(_ablation(paper, paper), {})).caveat == ""  # every task above chance


def test_the_section_counts_what_is_shown_from_the_findings():
    section = findings_section([_counting({1: 1.0, 4: 1.0, 5: 0.3, 8: 0.2}), _handover()])
    assert section.data["findings"][0]["verdict"] == "shown" and section.numbers["VAP hand-off"] == "shown"
    assert "2 of 2 tested findings are shown" in section.explanation
    assert section.numbers["Four head classes"] == "not tested" and len(section.table) == 6
    assert "<b>Subitizing: shown.</b>" in section.html
    with pytest.raises(KeyError):
        section.numbers["nope"]


def test_the_section_says_which_findings_are_untestable_and_which_untested():
    """A finding that cannot come out either way on this model is named "not testable on this model" in the
    section's summary sentence, as in its own line; one whose stage did not run is "not tested"."""
    section = findings_section([_counting({1: 1.0, 4: 1.0, 5: 0.3, 8: 0.2}), _handover()])
    findings = section.data["findings"]
    assert "; not tested: " in section.explanation and "not testable" not in section.explanation
    untestable = [Finding("k", "Made up", "c", "t", None, "e", testable=False)]
    assert untested_by_verdict(untestable) == [("not testable on this model", ["Made up"])]
    assert all(f["verdict"] in ("shown", "not shown", "not tested") for f in findings)

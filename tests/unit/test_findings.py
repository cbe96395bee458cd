"""The demo's statements of the paper's findings: each verdict follows its test on hand-made results,
and the hand-off layer's bootstrap on a hand-made patching sweep."""

from __future__ import annotations

import pytest
import torch

from vlens.demo.findings import (
    findings_section,
    handoff_finding,
    head_classes_finding,
    interventions_finding,
    jaccard_finding,
    late_lens_finding,
    subitizing_finding,
)
from vlens.demo.patching_stage import handover_bootstrap
from vlens.demo.report_sections import Section
from vlens.patching.metrics import Baseline
from vlens.patching.results import PatchingResult


def _counting(accuracy: dict[int, float], n: int = 20) -> Section:
    predictions = [{"target": c, "correct": i < round(a * n)} for c, a in accuracy.items() for i in range(n)]
    return Section("counting_accuracy", "t", "e", data={"counts": list(accuracy), "predictions": predictions,
                                                         "accuracy_per_count": list(accuracy.values())})


def test_subitizing_is_shown_only_when_small_counts_beat_large_ones_significantly():
    broken = subitizing_finding(_counting({1: 1.0, 2: 1.0, 3: 1.0, 4: 0.95, 5: 0.6, 6: 0.5, 7: 0.4}))
    assert broken.shown is True and broken.numbers["p_value"] < 1e-6
    assert "largest drop between consecutive counts is 4 -> 5" in broken.evidence
    flat = subitizing_finding(_counting({1: 1.0, 2: 1.0, 3: 1.0, 4: 1.0, 5: 1.0, 6: 1.0, 7: 0.95}))
    assert flat.shown is False and "not shown (p = " in flat.evidence
    assert subitizing_finding(None).verdict == "not tested"


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


def test_the_section_counts_what_is_shown_from_the_findings():
    section = findings_section([_counting({1: 1.0, 4: 1.0, 5: 0.3, 8: 0.2}), _handover()])
    assert section.data["findings"][0]["verdict"] == "shown" and section.numbers["VAP hand-off"] == "shown"
    assert "2 of 2 tested findings are shown" in section.explanation
    assert section.numbers["Four head classes"] == "not tested" and len(section.table) == 6
    assert "<b>Subitizing: shown.</b>" in section.html
    with pytest.raises(KeyError):
        section.numbers["nope"]

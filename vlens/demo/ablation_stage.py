"""Stage 7 (ablation): mean-ablate every head on several tasks; Jaccard overlap of the top-k head sets.

Every task is swept twice, on two independent samples of examples (`retest_seed`), so the report
shows each task's test-retest Jaccard and the chance level next to the cross-task matrix, and
states each finding as stable across resamples only where both samples agree.
"""

from __future__ import annotations

import html
from typing import TYPE_CHECKING

from vlens.ablation import AblationSettings, build_task_batch, cross_task_ablation, parse_task
from vlens.ablation.stability import overlap_stability
from vlens.data import TEMPLATES
from vlens.demo.report_sections import Section
from vlens.demo.settings import DemoSettings
from vlens.parallel.options import SweepOptions
from vlens.utils.stats import format_share, p_number

if TYPE_CHECKING:
    from vlens.core.model import HookedVLM


TITLE = "Ablation: Jaccard overlap of important heads across tasks"
EXPLANATION = ("Mean-ablate each head alone on each task and rank heads by the drop in the answer's log-probability; "
               "cells give the Jaccard similarity of two tasks' top-k head sets (1 = same heads, 0 = disjoint). "
               "The diagonal (*) is each task's test-retest Jaccard: its own top-k set on a second, independent "
               "sample of examples; under each value its p-value against two random top-k sets (exact "
               "hypergeometric null; bold: significant after Holm's correction over the pairs); the dashed line is "
               "the mean Jaccard of two random top-k sets.")
RETEST_OFFSET = 100_000  # the second sample's seeds start here (never overlapping the first sample's)


def task_description(name: str) -> str:
    """What a task-suite task asks, e.g. 'counting' -> 'synpoly: How many objects / ... are there?'."""
    task, style = parse_task(name)
    return f"{style}; " + " | ".join(TEMPLATES[task])


def ablation_section(model: HookedVLM, settings: DemoSettings, progress: bool = True) -> Section:
    n, size, seed = settings.ablation_examples, settings.image_side, settings.seed
    try:
        sets = {task: (build_task_batch(model, task, n, seed, size),
                       build_task_batch(model, task, n, seed, size, reference=True))
                for task in settings.ablation_tasks}
        # a second, independent evaluation sample per task (same reference means): test-retest
        retest = {task: build_task_batch(model, task, n, seed + RETEST_OFFSET, size) for task in settings.ablation_tasks}
        report = cross_task_ablation(model, sets, AblationSettings(top_k=settings.ablation_top_k, seed=seed),
                                     retest=retest, options=SweepOptions(batch_size=settings.batch_size,
                                                                         progress=progress))
    except ValueError as err:  # e.g. task answers that the tokenizer cannot express
        return Section.skipped("ablation_jaccard", TITLE, EXPLANATION, f"the ablation study could not run: {err}")
    report.settings.update(n_examples=n, n_reference=n, image_size=size, retest_seed_offset=RETEST_OFFSET)
    matrix, names = report.jaccard()
    stability = overlap_stability(report)
    n = len(names)
    off_diagonal = [float(matrix[i, j]) for i in range(n) for j in range(n) if i != j]
    chance = report.chance_jaccard()
    reliability = report.reliability() or {}
    numbers: dict[str, float | str] = {"top-k": report.top_k, "heads": report.n_heads_total,
               "mean off-diagonal Jaccard": sum(off_diagonal) / len(off_diagonal),
               "chance Jaccard (random top-k sets)": chance}
    numbers.update({f"{task} test-retest Jaccard": value for task, value in reliability.items()})
    if stability is not None and "counting" in names:
        row = names.index("counting")
        for j, other in enumerate(names):
            if j != row:
                numbers[f"counting vs {other} (sample 1 / 2)"] = (
                    f"{float(stability.first[row, j]):.2f} / {float(stability.second[row, j]):.2f} (Holm p "
                    f"{p_number(float(stability.first_holm[row, j]))} / {p_number(float(stability.second_holm[row, j]))})")
    findings = stability.findings(anchor="counting") if stability is not None else []
    table = [{"task": task, "asks (style; questions)": task_description(task),
              "clean acc [95% CI]": format_share(r.clean_accuracy, r.n_examples), "test-retest Jaccard": reliability.get(task),
              "top heads": ", ".join(f"L{layer}H{head}" for layer, head in r.top_heads(min(5, report.top_k),
                                                                                        report.rank_by))}
             for task, r in report.results.items()]
    explanation = (EXPLANATION + f" {settings.ablation_examples} examples per task and sample; the tasks are the "
                   "mixed task suite (several question templates, SynPoly shapes), not the demo's SynDot counting "
                   "images, so 'counting' accuracy here differs from the counting section. Whether each finding holds on both "
                   "samples is listed below.")
    findings_html = ("<ul class=\"findings\">" + "".join(f"<li>{html.escape(line)}</li>" for line in findings)
                     + "</ul>") if findings else None
    figure = report.plot(f"Top-{report.top_k} head sets ({report.rank_by} drop)")
    return Section(key="ablation_jaccard", title=TITLE, explanation=explanation, figure=figure, table=table,
                   html=findings_html,
                   definitions={"top-k": f"the {report.top_k} heads whose ablation lowers the answer's "
                                         "log-probability most",
                                "test-retest Jaccard": "Jaccard of a task's top-k set on two independent samples",
                                "acc": "accuracy without ablation (share of exact answers)",
                                "CI": "confidence interval (95% Wilson score interval over the examples)"},
                   numbers=numbers, data={**report.to_dict(), "findings": findings,
                                          "stability": None if stability is None else stability.to_dict()})

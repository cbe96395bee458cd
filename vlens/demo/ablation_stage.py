"""Stage 7 (ablation): mean-ablate every head on several tasks; Jaccard overlap of the top-k head sets."""

from __future__ import annotations

from vlens.ablation import build_task_batch, cross_task_ablation
from vlens.demo.report_sections import Section
from vlens.demo.settings import DemoSettings

TITLE = "Ablation: Jaccard overlap of important heads across tasks"
EXPLANATION = ("Mean-ablate each head alone on each task and rank heads by the drop in the answer's log-probability; "
               "cells give the Jaccard similarity of two tasks' top-k head sets (1 = same heads, 0 = disjoint).")


def ablation_section(model, settings: DemoSettings, progress: bool = True) -> Section:
    n, size, seed = settings.ablation_examples, settings.image_size, settings.seed
    try:
        sets = {task: (build_task_batch(model, task, n, seed, size),
                       build_task_batch(model, task, n, seed, size, reference=True))
                for task in settings.ablation_tasks}
        report = cross_task_ablation(model, sets, top_k=settings.ablation_top_k, batch_size=settings.batch_size,
                                     seed=seed, progress=progress)
    except ValueError as err:  # e.g. task answers that the tokenizer cannot express
        return Section.skipped("ablation_jaccard", TITLE, EXPLANATION, f"the ablation study could not run: {err}")
    report.settings.update(n_examples=n, n_reference=n, image_size=size)
    matrix, names = report.jaccard()
    n = len(names)
    off_diagonal = [float(matrix[i, j]) for i in range(n) for j in range(n) if i != j]
    numbers = {"top-k": report.top_k, "heads": int(next(iter(report.results.values())).ablated_logprob.numel()),
               "mean off-diagonal Jaccard": sum(off_diagonal) / len(off_diagonal)}
    if "counting" in names:
        row = names.index("counting")
        for j, other in enumerate(names):
            if j != row:
                numbers[f"counting vs {other}"] = float(matrix[row, j])
    table = [{"task": task, "clean accuracy": r.clean_accuracy, "clean log p": r.clean_logprob,
              "top heads": ", ".join(f"L{layer}H{head}" for layer, head in r.top_heads(min(5, report.top_k), report.rank_by))}
             for task, r in report.results.items()]
    return Section(key="ablation_jaccard", title=TITLE, explanation=EXPLANATION,
                   figure=report.plot(), table=table, numbers=numbers, data=report.to_dict())

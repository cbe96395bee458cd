"""Head ablation (mean / zero / resample on `hook_z`), per-task head importance and the
Jaccard overlap of top-k head sets across tasks (docs/method.md, section 6).

    import vlens
    from vlens.ablation import AblationSettings, build_task_batch, cross_task_ablation
    model = vlens.load()
    sets = {task: (build_task_batch(model, task, 64), build_task_batch(model, task, 64, reference=True))
            for task in ("counting", "colour", "spatial", "arithmetic")}
    report = cross_task_ablation(model, sets, AblationSettings(top_k=20))
    print(report.summary()); report.save("out/"); report.plot().show()

The paper's study on the task suites (seven tasks, retest seeds, overlap with a patching head
set) is `vlens ablate`, in `vlens.studies.ablation`. Lower level: `build_task_batch` (evaluation / reference sets), `collect_reference` (head
means, aligned over all positions / per position / per region), `head_ablation_sweep`
(every head alone), `AblationSettings` (what an ablation measures; how it runs is
`vlens.SweepOptions`), `ablation_hooks` (ablate chosen heads in any run), `top_k_heads`,
`jaccard_matrix`.
"""

from vlens.ablation.crosstask import REFERENCE_MODES, cross_task_ablation
from vlens.ablation.hooks import METHODS, ablation_hooks, replacement_values
from vlens.ablation.overlap import (
    chance_jaccard,
    head_set_from_json,
    holm_matrix,
    jaccard,
    jaccard_matrix,
    jaccard_p_matrix,
    jaccard_p_value,
    rank_heads,
    top_k_heads,
)
from vlens.ablation.reference import ALIGNMENTS, ReferenceActivations, collect_reference, resample_partners
from vlens.ablation.results import RANK_BY, AblationReport, HeadAblation
from vlens.ablation.settings import AblationSettings
from vlens.ablation.sweep import answer_metrics, head_ablation_sweep
from vlens.ablation.tasks import TaskBatch, answer_token_ids, build_task_batch, parse_task

__all__ = [
    "ALIGNMENTS",
    "METHODS",
    "RANK_BY",
    "REFERENCE_MODES",
    "AblationReport",
    "AblationSettings",
    "HeadAblation",
    "ReferenceActivations",
    "TaskBatch",
    "ablation_hooks",
    "answer_metrics",
    "answer_token_ids",
    "build_task_batch",
    "chance_jaccard",
    "collect_reference",
    "cross_task_ablation",
    "head_ablation_sweep",
    "head_set_from_json",
    "holm_matrix",
    "jaccard",
    "jaccard_matrix",
    "jaccard_p_matrix",
    "jaccard_p_value",
    "parse_task",
    "rank_heads",
    "replacement_values",
    "resample_partners",
    "top_k_heads",
]

"""Head ablation (mean / zero / resample on `hook_z`), per-task head importance and the
Jaccard overlap of top-k head sets across tasks (docs/method.md, section 6).

    import vlens
    from vlens.ablation import ablation_study
    model = vlens.load()
    report = ablation_study(model, ["counting", "colour", "spatial", "arithmetic"], top_k=20)
    print(report.summary()); report.to_json("ablation.json"); report.jaccard_figure().show()

Lower level: `build_task_batch` (evaluation / reference sets), `collect_reference` (head
means, aligned over all positions / per position / per region), `head_ablation_sweep`
(every head alone), `ablation_hooks` (ablate chosen heads in any run), `top_k_heads`,
`jaccard_matrix`.
"""

from vlens.ablation.hooks import METHODS, ablation_hooks, replacement_values
from vlens.ablation.overlap import (
    chance_jaccard,
    head_set_from_json,
    jaccard,
    jaccard_matrix,
    rank_heads,
    top_k_heads,
)
from vlens.ablation.reference import ALIGNMENTS, ReferenceActivations, collect_reference, resample_partners
from vlens.ablation.results import RANK_BY, AblationReport, HeadAblation
from vlens.ablation.study import DEFAULT_TASKS, ablation_study, add_patching_overlap
from vlens.ablation.sweep import answer_metrics, head_ablation_sweep
from vlens.ablation.tasks import TaskBatch, answer_token_ids, build_task_batch, parse_task

__all__ = [
    "ALIGNMENTS",
    "DEFAULT_TASKS",
    "METHODS",
    "RANK_BY",
    "AblationReport",
    "HeadAblation",
    "ReferenceActivations",
    "TaskBatch",
    "ablation_hooks",
    "ablation_study",
    "add_patching_overlap",
    "answer_metrics",
    "answer_token_ids",
    "build_task_batch",
    "chance_jaccard",
    "collect_reference",
    "head_ablation_sweep",
    "head_set_from_json",
    "jaccard",
    "jaccard_matrix",
    "parse_task",
    "rank_heads",
    "replacement_values",
    "resample_partners",
    "top_k_heads",
]

"""Ablation across tasks: every head ablated on every task, each task's heads ranked, the tasks'
top-k head sets compared by Jaccard (docs/method.md, section 6).

    sets = {task: (build_task_batch(model, task, 64), build_task_batch(model, task, 64, reference=True))
            for task in ("counting", "colour")}
    report = cross_task_ablation(model, sets, AblationSettings(top_k=20))
    report.summary(); report.save("out/"); report.plot()
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from vlens.ablation.reference import collect_reference
from vlens.ablation.results import AblationReport
from vlens.ablation.settings import REFERENCE_MODES, AblationSettings, split_legacy
from vlens.ablation.sweep import head_ablation_sweep
from vlens.ablation.tasks import TaskBatch
from vlens.parallel.options import SweepOptions, fold_legacy
from vlens.utils.errors import UserInputError
from vlens.utils.validation import check_top_k

if TYPE_CHECKING:
    from vlens.core.model import HookedVLM

__all__ = ["REFERENCE_MODES", "cross_task_ablation"]


def cross_task_ablation(
    model: HookedVLM,
    tasks: Mapping[str, tuple[TaskBatch, TaskBatch]],
    settings: AblationSettings | None = None,
    retest: Mapping[str, TaskBatch] | None = None,
    options: SweepOptions | None = None,
    **legacy: Any,
) -> AblationReport:
    """Ablate every head on every task; rank heads per task; compare top-k sets by Jaccard.

    Args:
        model: the model.
        tasks: {name: (evaluation TaskBatch, reference TaskBatch)}, e.g. from `build_task_batch`.
        settings: the ablation method, alignment, reference mode, top_k, rank_by and seeds
            (`AblationSettings`; default mean ablation, region alignment, top 20 by log-prob drop).
        retest: {name: a second evaluation set} swept with the same reference means:
            `report.reliability()` compares the two top-k sets per task (resampling seed
            `settings.retest_seed`, default `settings.seed`).
        options: `batch_size` (examples per forward, default 16), `heads_per_pass`, `progress`,
            `sharding` (each sweep split across processes; every process builds the same
            reference means and returns the full report), `cache_device` (`vlens.SweepOptions`).
    Returns:
        an `AblationReport`.
    """
    settings, rest = split_legacy(settings, legacy, "cross_task_ablation")
    options = fold_legacy(options, rest, "cross_task_ablation", ("batch_size", "heads_per_pass", "progress",
                                                                 "sharding"))
    options.require_final("cross_task_ablation")
    check_top_k(settings.top_k, "top_k", model.cfg.n_heads_total)
    if not tasks:
        raise UserInputError("cross_task_ablation got no tasks")
    unknown = sorted(set(retest or {}) - set(tasks))
    if unknown:
        raise UserInputError(f"retest sets {unknown} name no task of {sorted(tasks)}")
    method = settings.method
    keep_samples = method == "resample"
    pooled = None
    if method != "zero" and settings.reference_mode == "pooled":
        pooled = collect_reference(model, TaskBatch.concat("pooled", [ref for _, ref in tasks.values()]),
                                   settings.alignment, keep_samples, options)
    results, retested = {}, {}
    for name, (evaluation, ref_set) in tasks.items():
        reference = pooled
        if method != "zero" and reference is None:
            reference = collect_reference(model, ref_set, settings.alignment, keep_samples, options)
        results[name] = head_ablation_sweep(model, evaluation, method, reference, seed=settings.seed, options=options)
        if retest is not None and name in retest:
            seed = settings.seed if settings.retest_seed is None else settings.retest_seed
            retested[name] = head_ablation_sweep(model, retest[name], method, reference, seed=seed, options=options)
    recorded = {
        "model": model.summary(), "method": method, "alignment": settings.alignment if method != "zero" else "none",
        "reference_mode": settings.reference_mode, "seed": settings.seed, "world_size": options.shards.world_size,
    }
    return AblationReport(results, settings.top_k, settings.rank_by, recorded, retest=retested or None)

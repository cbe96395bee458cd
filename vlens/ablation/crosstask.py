"""Ablation across tasks: every head ablated on every task, each task's heads ranked, the tasks'
top-k head sets compared by Jaccard (docs/method.md, section 6).

    sets = {task: (build_task_batch(model, task, 64), build_task_batch(model, task, 64, reference=True))
            for task in ("counting", "colour")}
    report = cross_task_ablation(model, sets, top_k=20)
    report.summary(); report.save("out/"); report.plot()
"""

from __future__ import annotations

from collections.abc import Mapping

from vlens.ablation.reference import collect_reference
from vlens.ablation.results import RANK_BY, AblationReport
from vlens.ablation.sweep import head_ablation_sweep
from vlens.ablation.tasks import TaskBatch
from vlens.parallel import Sharding
from vlens.utils.validation import check_count, check_top_k

REFERENCE_MODES: tuple[str, ...] = ("per-task", "pooled")


def cross_task_ablation(
    model,
    tasks: Mapping[str, tuple[TaskBatch, TaskBatch]],
    method: str = "mean",
    alignment: str = "region",
    reference_mode: str = "per-task",
    top_k: int = 20,
    rank_by: str = "logprob",
    batch_size: int = 16,
    heads_per_pass: int = 8,
    seed: int = 0,
    retest: Mapping[str, TaskBatch] | None = None,
    retest_seed: int | None = None,
    progress: bool = True,
    sharding: Sharding | None = None,
) -> AblationReport:
    """Ablate every head on every task; rank heads per task; compare top-k sets by Jaccard.

    Args:
        tasks: {name: (evaluation TaskBatch, reference TaskBatch)}, e.g. from `build_task_batch`.
        method, alignment: see `head_ablation_sweep` and `vlens.ablation.reference`.
        reference_mode: "per-task" (each task's own reference set) or "pooled" (all tasks'
            reference sets together, one mean for every task).
        top_k, rank_by: size of each task's head set; rank by "logprob" or "accuracy" drop.
        seed: the resampling seed (method "resample").
        retest: {name: a second evaluation set} swept with the same reference means:
            `report.reliability()` compares the two top-k sets per task; `retest_seed` is its
            resampling seed (default `seed`).
        sharding: split each sweep across processes (`vlens.parallel`); every process builds the
            same reference means and returns the full report.
    """
    sharding = sharding or Sharding()
    shown = sharding.progress(progress)
    check_top_k(top_k, "top_k", model.cfg.n_heads_total)
    for name, value in (("batch_size", batch_size), ("heads_per_pass", heads_per_pass)):
        check_count(value, name, min=1)
    if reference_mode not in REFERENCE_MODES:
        raise ValueError(f"reference_mode must be one of {REFERENCE_MODES}, got {reference_mode!r}")
    if rank_by not in RANK_BY:
        raise ValueError(f"rank_by must be one of {RANK_BY}, got {rank_by!r}")
    if not tasks:
        raise ValueError("cross_task_ablation got no tasks")
    unknown = sorted(set(retest or {}) - set(tasks))
    if unknown:
        raise ValueError(f"retest sets {unknown} name no task of {sorted(tasks)}")
    keep_samples = method == "resample"
    pooled = None
    if method != "zero" and reference_mode == "pooled":
        pooled = collect_reference(model, TaskBatch.concat("pooled", [ref for _, ref in tasks.values()]),
                                   alignment, batch_size, keep_samples, shown)
    results, retested = {}, {}
    for name, (evaluation, ref_set) in tasks.items():
        reference = pooled
        if method != "zero" and reference is None:
            reference = collect_reference(model, ref_set, alignment, batch_size, keep_samples, shown)
        results[name] = head_ablation_sweep(model, evaluation, method, reference, batch_size, heads_per_pass,
                                            seed=seed, progress=progress, sharding=sharding)
        if retest is not None and name in retest:
            retested[name] = head_ablation_sweep(model, retest[name], method, reference, batch_size, heads_per_pass,
                                                 seed=seed if retest_seed is None else retest_seed,
                                                 progress=progress, sharding=sharding)
    settings = {
        "model": model.summary(), "method": method, "alignment": alignment if method != "zero" else "none",
        "reference_mode": reference_mode, "seed": seed, "world_size": sharding.world_size,
    }
    return AblationReport(results, top_k, rank_by, settings, retest=retested or None)

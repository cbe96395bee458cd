"""The cross-task study of PAPER.md section 3: per-task head rankings, top-k sets, Jaccard."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from vlens.ablation.overlap import head_set_from_json, jaccard
from vlens.ablation.reference import collect_reference
from vlens.ablation.results import RANK_BY, AblationReport
from vlens.ablation.sweep import head_ablation_sweep
from vlens.ablation.tasks import TaskBatch, build_task_batch, canonical_task_name
from vlens.errors import UserInputError
from vlens.parallel import Sharding
from vlens.validation import check_count, check_top_k

DEFAULT_TASKS: tuple[str, ...] = (
    "counting", "colour", "shape", "spatial", "arithmetic", "existence", "counting@synreal",
)
REFERENCE_MODES: tuple[str, ...] = ("per-task", "pooled")


def ablation_study(
    model,
    tasks: Sequence[str] | Mapping[str, tuple[TaskBatch, TaskBatch]] = DEFAULT_TASKS,
    n_examples: int = 64,
    n_reference: int = 64,
    method: str = "mean",
    alignment: str = "region",
    reference_mode: str = "per-task",
    top_k: int = 20,
    rank_by: str = "logprob",
    image_size: int = 224,
    batch_size: int = 16,
    heads_per_pass: int = 8,
    seed: int = 0,
    retest_seed: int | None = None,
    progress: bool = True,
    sharding: Sharding | None = None,
) -> AblationReport:
    """Ablate every head on every task; rank heads per task; compare top-k sets by Jaccard.

    Args:
        tasks: task-suite names ("counting", "counting@synreal", ...) built with
            `build_task_batch`, or {name: (evaluation TaskBatch, reference TaskBatch)}.
        n_examples, n_reference: evaluation / reference examples per task (disjoint seeds).
        method, alignment: see `head_ablation_sweep` and `vlens.ablation.reference`.
        reference_mode: "per-task" (each task's own reference set) or "pooled" (all tasks'
            reference sets together, one mean for every task).
        top_k, rank_by: size of each task's head set; rank by "logprob" or "accuracy" drop.
        retest_seed: also sweep a second evaluation set (seeds retest_seed, retest_seed + 1, ...;
            task-suite names only) with the same reference: `report.reliability()`.
        sharding: split each sweep across processes (`vlens.parallel`); every process builds the
            same examples and reference means and returns the full report (rank 0 writes it).
    """
    sharding = sharding or Sharding()
    shown = sharding.progress(progress)
    check_top_k(top_k, "top_k", model.cfg.n_layers * model.cfg.n_heads)
    for name, value in (("n_examples", n_examples), ("n_reference", n_reference), ("batch_size", batch_size),
                        ("heads_per_pass", heads_per_pass), ("image_size", image_size)):
        check_count(value, name, min=28 if name == "image_size" else 1)
    if reference_mode not in REFERENCE_MODES:
        raise ValueError(f"reference_mode must be one of {REFERENCE_MODES}, got {reference_mode!r}")
    if rank_by not in RANK_BY:
        raise ValueError(f"rank_by must be one of {RANK_BY}, got {rank_by!r}")
    if isinstance(tasks, Mapping):
        sets = dict(tasks)
    else:
        names = [canonical_task_name(t) for t in tasks]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate task in {list(tasks)}")
        sets = {name: (build_task_batch(model, name, n_examples, seed, image_size),
                       build_task_batch(model, name, n_reference, seed, image_size, reference=True))
                for name in names}
    keep_samples = method == "resample"
    pooled = None
    if method != "zero" and reference_mode == "pooled":
        pooled = collect_reference(model, TaskBatch.concat("pooled", [ref for _, ref in sets.values()]),
                                   alignment, batch_size, keep_samples, shown)
    if retest_seed is not None and isinstance(tasks, Mapping):
        raise ValueError("retest_seed needs task-suite names (the second evaluation set is drawn from them)")
    if retest_seed is not None and abs(retest_seed - seed) < n_examples:
        raise UserInputError(f"retest seeds {retest_seed}..{retest_seed + n_examples - 1} overlap the evaluation seeds "
                         f"{seed}..{seed + n_examples - 1}: use a retest seed >= {seed + n_examples}")
    results, retest = {}, {}
    for name, (evaluation, ref_set) in sets.items():
        reference = pooled
        if method != "zero" and reference is None:
            reference = collect_reference(model, ref_set, alignment, batch_size, keep_samples, shown)
        results[name] = head_ablation_sweep(model, evaluation, method, reference, batch_size, heads_per_pass,
                                            seed=seed, progress=progress, sharding=sharding)
        if retest_seed is not None:
            again = build_task_batch(model, name, n_examples, retest_seed, image_size)
            retest[name] = head_ablation_sweep(model, again, method, reference, batch_size, heads_per_pass,
                                               seed=retest_seed, progress=progress, sharding=sharding)
    settings = {
        "model": model.summary(), "method": method, "alignment": alignment if method != "zero" else "none",
        "reference_mode": reference_mode, "n_examples": n_examples, "n_reference": n_reference,
        "image_size": image_size, "seed": seed, "retest_seed": retest_seed, "world_size": sharding.world_size,
    }
    return AblationReport(results, top_k, rank_by, settings, retest=retest or None)


def add_patching_overlap(report: AblationReport, patching, source: str = "", k: int | None = None,
                         metric: str | None = None) -> dict:
    """Jaccard between the patching head set (VAP head sweep) and each task's ablation set.

    patching: parsed JSON of `vlens patch --mode layer-head` (or atp), a [n_layers, n_heads]
        grid, {"heads": [[layer, head], ...]}, or {"tasks": {task: any of those}} / {task: ...}
        to compare task by task (see `head_set_from_json`).
    metric: which patching grid ranks the heads (default: patch_effect, then overwrite_rate, ...).
    The result is stored in `report.patching` and returned.
    """
    k = k or report.top_k
    first = next(iter(report.results.values())).ablated_logprob
    n_layers, n_heads = first.shape
    ablation_sets = report.head_sets()
    per_task = patching.get("tasks") if isinstance(patching, Mapping) else None
    if per_task is None and isinstance(patching, Mapping) and set(patching) & set(ablation_sets):
        per_task = patching
    if per_task is not None:
        heads = {t: head_set_from_json(per_task[t], n_layers, n_heads, k, metric) for t in ablation_sets if t in per_task}
        if not heads:
            raise ValueError(f"the patching file names tasks {sorted(per_task)} but the report has "
                             f"{sorted(ablation_sets)}: no task in common")
    else:
        shared = head_set_from_json(patching, n_layers, n_heads, k, metric)
        heads = {t: shared for t in ablation_sets}
    report.patching = {
        "source": source, "top_k": k, "metric": metric,
        "heads": {t: [list(h) for h in hs] for t, hs in heads.items()},
        "jaccard": {t: jaccard(hs, ablation_sets[t]) for t, hs in heads.items()},
    }
    return report.patching

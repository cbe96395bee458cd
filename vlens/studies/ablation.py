"""The cross-task ablation study on the synthetic task suites (docs/method.md, section 6):
the paper's seven tasks, evaluation / reference / retest sets on disjoint seeds, and the
overlap of each task's ablation head set with a patching head set (`vlens ablate`).

The method itself is the library's `vlens.ablation.cross_task_ablation`; this module only
chooses the tasks and draws their examples.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vlens.ablation import (
    AblationReport,
    AblationSettings,
    TaskBatch,
    build_task_batch,
    cross_task_ablation,
    head_set_from_json,
    jaccard,
)
from vlens.ablation.experts import cross_task_expert_ablation
from vlens.ablation.overlap import unranked_heads
from vlens.ablation.settings import split_legacy
from vlens.ablation.tasks import canonical_task_name, dataset_task_batches
from vlens.parallel.options import SweepOptions, fold_legacy
from vlens.utils.errors import UserInputError
from vlens.utils.validation import check_count

if TYPE_CHECKING:
    from vlens.core.model import HookedVLM

DEFAULT_TASKS: tuple[str, ...] = (
    "counting", "colour", "shape", "spatial", "arithmetic", "existence", "counting@synreal",
)


def ablation_study(
    model: HookedVLM,
    tasks: Sequence[str] | Mapping[str, tuple[TaskBatch, TaskBatch]] = DEFAULT_TASKS,
    n_examples: int = 64,
    n_reference: int = 64,
    image_size: int = 224,
    settings: AblationSettings | None = None,
    options: SweepOptions | None = None,
    **legacy: Any,
) -> AblationReport:
    """`cross_task_ablation` on task-suite tasks ("counting", "counting@synreal", ...) or on given
    {name: (evaluation TaskBatch, reference TaskBatch)} (e.g. real datasets).

    Args:
        model: the model.
        tasks: task-suite names or ready task batches.
        n_examples, n_reference: evaluation / reference examples per task (disjoint seeds, from
            `settings.seed`).
        image_size: side in px of the rendered task images.
        settings: `AblationSettings`; with `retest_seed`, also sweep a second evaluation set
            (seeds retest_seed, retest_seed + 1, ...) with the same reference: `report.reliability()`;
            with `unit="expert"`, every expert of the MoE layers instead of every head
            (`vlens.ablation.experts.cross_task_expert_ablation`: alignment and reference_mode do not
            apply, each task's own reference means; `options.heads_per_pass` is experts per pass).
        options: how the sweeps run (`vlens.SweepOptions`).
    Returns:
        the `AblationReport` (its settings also record the sizes and the retest seed).
    """
    settings, rest = split_legacy(settings, legacy, "ablation_study")
    options = fold_legacy(options, rest, "ablation_study", ("batch_size", "heads_per_pass", "progress", "sharding"))
    seed, retest_seed = settings.seed, settings.retest_seed
    for name, value in (("n_examples", n_examples), ("n_reference", n_reference), ("image_size", image_size)):
        check_count(value, name, min=28 if name == "image_size" else 1)
    if retest_seed is not None and isinstance(tasks, Mapping):
        raise UserInputError("retest_seed needs task-suite names (the second evaluation set is drawn from them)")
    if retest_seed is not None and abs(retest_seed - seed) < n_examples:
        raise UserInputError(f"retest seeds {retest_seed}..{retest_seed + n_examples - 1} overlap the evaluation seeds "
                             f"{seed}..{seed + n_examples - 1}: use a retest seed >= {seed + n_examples}")
    if isinstance(tasks, Mapping):
        sets = dict(tasks)
    else:
        names = [canonical_task_name(t) for t in tasks]
        if len(set(names)) != len(names):
            raise UserInputError(f"duplicate task in {list(tasks)}")
        sets = {name: (build_task_batch(model, name, n_examples, seed, image_size),
                       build_task_batch(model, name, n_reference, seed, image_size, reference=True))
                for name in names}
    retest = None if retest_seed is None else {
        name: build_task_batch(model, name, n_examples, retest_seed, image_size) for name in sets}
    if settings.unit == "expert":
        report = cross_task_expert_ablation(model, sets, settings, retest=retest, options=options)
    else:
        report = cross_task_ablation(model, sets, settings, retest=retest, options=options)
    report.settings.update(n_examples=n_examples, n_reference=n_reference, image_size=image_size,
                           retest_seed=retest_seed)
    return report


def tasks_with_datasets(model: HookedVLM, names: Sequence[str], datasets: Sequence, n_examples: int, n_reference: int,
                        seed: int = 0, image_size: int = 224) -> dict[str, tuple[TaskBatch, TaskBatch]]:
    """{task: (evaluation, reference)}: the task-suite tasks `names`, then one task per real dataset
    (`vlens.datasets.load_dataset` results), named after its file (repeated names get a number)."""
    tasks: dict[str, tuple[TaskBatch, TaskBatch]] = {}
    for name in names:
        name = canonical_task_name(name)
        tasks[name] = (build_task_batch(model, name, n_examples, seed, image_size),
                       build_task_batch(model, name, n_reference, seed, image_size, reference=True))
    for dataset in datasets:
        source = Path(dataset.source)
        name = source.parent.name if source.name == "metadata.jsonl" else source.stem
        label, number = name, 2
        while label in tasks:
            label, number = f"{name}-{number}", number + 1
        tasks[label] = dataset_task_batches(model, dataset, n_examples, n_reference, name=label)
    return tasks


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
            raise UserInputError(f"the patching file names tasks {sorted(per_task)} but the report has "
                             f"{sorted(ablation_sets)}: no task in common")
    else:
        shared = head_set_from_json(patching, n_layers, n_heads, k, metric)
        heads = {t: shared for t in ablation_sets}
    tables = per_task if per_task is not None else {t: patching for t in heads}
    report.patching = {
        "source": source, "top_k": k, "metric": metric,
        "unranked_heads": {t: unranked_heads(tables[t], metric) for t in heads},  # null scores, left out
        "heads": {t: [list(h) for h in hs] for t, hs in heads.items()},
        "jaccard": {t: jaccard(hs, ablation_sets[t]) for t, hs in heads.items()},
    }
    return report.patching

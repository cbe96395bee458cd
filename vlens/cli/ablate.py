"""`vlens ablate`: the cross-task ablation study (`vlens.studies.ablation`), a thin command.

    vlens ablate --model tiny --tasks counting,colour,spatial,arithmetic --top-k 20 --out runs/ablation
    vlens ablate --model PATH --data pixmo.parquet countbenchqa.parquet --image-dir images/ --out runs/real
    vlens ablate --model PATH --data pixmo.parquet --tasks none --out runs/pixmo-only
    vlens ablate --model MOE_DIR --unit expert --tasks counting,colour --top-k 10 --out runs/experts

Writes ``results.json`` (the report), ``report.html`` (Jaccard heatmap, per-task damage heatmaps,
top heads) and ``summary.md`` into ``--out``.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from vlens.cli.console import echo, non_finite_exit
from vlens.cli.dataset_options import add_data_arguments, load_data_arg, mark_input_paths
from vlens.cli.options import (
    RESULTS_FILE,
    add_batch_size,
    add_model_options,
    add_out,
    load_model_from_args,
    prepare_out,
    rendered_size,
    task_list_arg,
)
from vlens.utils.errors import UserInputError
from vlens.utils.fileio import read_json_file
from vlens.utils.finite import add_allow_nan_argument
from vlens.utils.validation import arg_int, arg_path

logger = logging.getLogger(__name__)

# vlens.ablation's names, spelled out so that building this parser imports no torch
# (tests/cli/test_conventions.py checks them against the library)
METHODS = ("mean", "zero", "resample")
ALIGNMENTS = ("all", "position", "region")
RANK_BY = ("logprob", "accuracy")
DEFAULT_TASKS = ("counting", "colour", "shape", "spatial", "arithmetic", "existence", "counting@synreal")
REFERENCE_MODES = ("per-task", "pooled")
UNITS = ("head", "expert")
REPORT_HTML, SUMMARY_MD = "report.html", "summary.md"


TOP_K_DEFAULT = 20  # heads (or experts) per task's set

def configure(parser: argparse.ArgumentParser) -> None:
    """`vlens ablate`."""
    parser.description = ("Ablate each head alone (on hook_z) on task-suite examples, rank heads by the drop in "
                          "answer log-probability (or accuracy) per task, and compare the tasks' top-k head sets "
                          "by Jaccard similarity.")
    add_model_options(parser, render_default="model")
    add_data_arguments(parser, multiple=True,
                       help="real datasets, each one task named after its file (PixMo-Count, CountBenchQA, "
                            "multiple choice, imagefolders, qa rows; see --format), run with the task suites "
                            "(--tasks; --tasks none for the real sets alone). Of each set's readable records the "
                            "first --n-examples are evaluated and the next --n-reference give the reference means; "
                            "a smaller set is split in half (the command says how each set was split)")
    parser.add_argument("--tasks", default=None, type=task_list_arg,
                        help="comma-separated tasks, TASK or TASK@STYLE (e.g. counting@synreal), or none (only the "
                             f"--data sets); default {','.join(DEFAULT_TASKS)}, with --data too")
    parser.add_argument("--unit", choices=UNITS, default="head",
                        help="what is ablated: each attention head (hook_z), or each expert of every mixture-of-"
                             "experts layer (its output where the router chose it; --method mean or zero)")
    parser.add_argument("--top-k", type=arg_int(min=1), default=TOP_K_DEFAULT,
                        help=f"size of each task's head set (default {TOP_K_DEFAULT})")
    parser.add_argument("--method", choices=METHODS, default="mean", help="ablation (default mean)")
    parser.add_argument("--alignment", choices=ALIGNMENTS, default="region",
                        help="how reference means are aligned: one mean over all positions, per position "
                             "from the end, or per token region (default region)")
    parser.add_argument("--reference", choices=REFERENCE_MODES, default="per-task",
                        help="reference set: each task's own held-out examples, or all tasks' pooled")
    parser.add_argument("--rank-by", choices=RANK_BY, default="logprob", help="damage metric for the ranking")
    parser.add_argument("--n-examples", type=arg_int(min=1), default=64, help="evaluation examples per task")
    parser.add_argument("--n-reference", type=arg_int(min=1), default=64,
                        help="reference examples per task (other seeds)")
    add_batch_size(parser, 16)
    parser.add_argument("--heads-per-pass", type=arg_int(min=1), default=8,
                        help="heads of one layer run in one stacked batch")
    parser.add_argument("--seed", type=arg_int(min=0), default=0,
                        help="seed of the evaluation set (and of resampling with --method resample)")
    parser.add_argument("--retest-seed", type=arg_int(min=0), default=None,
                        help="also sweep a second evaluation set from this seed and report, per task, the Jaccard "
                             "of the two top-k sets (reliability); use a seed >= seed + n-examples")
    patching = parser.add_argument("--patching", type=arg_path, default=None,
                        help="results.json of a `vlens patch --mode layer-head` (or atp) run, or any JSON with a head "
                             "score grid or head list, optionally per task: also report its Jaccard with each "
                             "task's ablation set")
    mark_input_paths(parser, patching.dest)
    parser.add_argument("--patching-metric", default=None,
                        help="grid of the patching JSON that ranks heads (default patch_effect, then overwrite_rate)")
    add_out(parser, f"{RESULTS_FILE}, {REPORT_HTML}, {SUMMARY_MD}")
    add_allow_nan_argument(parser)
    parser.set_defaults(func=run_ablate, shardable=True)  # torchrun splits each sweep (vlens.parallel)


def run_ablate(args: argparse.Namespace) -> int:
    from vlens.ablation import AblationSettings
    from vlens.parallel.options import SweepOptions
    from vlens.studies.ablation import ablation_study, add_patching_overlap, tasks_with_datasets
    from vlens.utils.finite import collect_non_finite
    from vlens.utils.validation import check_top_k

    if args.tasks is None:  # the task suites stay in the comparison when real sets are added
        args.tasks = ",".join(DEFAULT_TASKS)
    tasks = [] if args.tasks == "none" else [t for t in args.tasks.split(",") if t.strip()]
    if not tasks and not args.data:
        raise UserInputError("--tasks is empty or none: give e.g. --tasks counting,colour (or real sets with --data)")
    datasets = [load_data_arg(args, path) for path in args.data or []]  # read (and checked) before the model
    if args.patching is not None and not args.patching.is_file():
        raise UserInputError(f"--patching {args.patching}: no such file")
    if args.unit == "expert" and args.patching is not None:
        raise UserInputError("--patching compares head sets: it does not apply to --unit expert")
    if args.unit == "expert" and args.method == "resample":
        raise UserInputError("--unit expert ablates with --method mean or zero (resampling an expert is not defined)")
    out = prepare_out(args, RESULTS_FILE, REPORT_HTML, SUMMARY_MD)
    patching = _read_json(args.patching, "--patching") if args.patching is not None else None
    model = load_model_from_args(args)
    units = model.cfg.n_heads_total if args.unit == "head" else len(model.cfg.moe_layers) * model.cfg.n_experts
    if args.unit == "expert" and not units:
        raise UserInputError(f"--unit expert: {model.cfg.architecture} has no mixture-of-experts layer")
    if args.top_k == TOP_K_DEFAULT and args.top_k >= units:  # the default, not a value the user gave
        raise UserInputError(f"the default --top-k {TOP_K_DEFAULT} is not fewer than this model's {units} "
                             f"{args.unit}s: give --top-k k with 1 <= k < {units}")
    check_top_k(args.top_k, "--top-k", units)  # before the sweep
    if patching is not None:  # a wrong --patching-metric or grid fails now, not after the sweep
        _check_patching(patching, model, args)
    suite = (tasks_with_datasets(model, tasks, datasets, args.n_examples, args.n_reference, args.seed,
                                 rendered_size(args)) if datasets else tasks)
    splits = _data_splits(suite, len(datasets), args) if isinstance(suite, dict) else {}
    with collect_non_finite() as problems:
        report = ablation_study(
            model, suite, n_examples=args.n_examples, n_reference=args.n_reference,
            image_size=rendered_size(args),
            settings=AblationSettings(method=args.method, alignment=args.alignment, reference_mode=args.reference,
                                      top_k=args.top_k, rank_by=args.rank_by, seed=args.seed,
                                      retest_seed=args.retest_seed, unit=args.unit),
            options=SweepOptions(batch_size=args.batch_size, heads_per_pass=args.heads_per_pass,
                                 progress=not args.quiet, sharding=args.sharding),
        )
    if not args.sharding.is_main:  # every rank holds the report; rank 0 writes it
        return non_finite_exit(problems, True, "vlens ablate")
    report.settings["model_arg"] = args.model
    if splits:
        report.settings["data_splits"] = splits
    if args.patching is not None:
        add_patching_overlap(report, patching, source=str(args.patching), metric=args.patching_metric)
    report.save(out / RESULTS_FILE)
    written = [out / RESULTS_FILE]
    try:
        from vlens.ablation.stability import overlap_stability

        stability = overlap_stability(report)  # None without --retest-seed
        report.html_report(findings=stability.findings() if stability is not None else None).write(out / REPORT_HTML)
        written.append(out / REPORT_HTML)
    except ImportError as error:
        logger.warning("no %s: %s (install the viz extra: pip install 'vlens[viz]')", REPORT_HTML, error)
    (out / SUMMARY_MD).write_text(report.to_markdown())
    written.append(out / SUMMARY_MD)
    echo(report.summary())
    logger.info("wrote %s", ", ".join(str(p) for p in written))
    return non_finite_exit(problems, args.allow_nan, "vlens ablate")


def _data_splits(suite: dict, n_datasets: int, args: argparse.Namespace) -> dict[str, dict]:
    """How each --data set was split between evaluation and the reference means: said on stderr, kept
    in results.json (settings.data_splits)."""
    splits = {}
    names = list(suite)
    suites, sets = names[: len(names) - n_datasets], names[len(names) - n_datasets:]
    for name in sets:
        evaluation, reference = suite[name]
        n_eval, n_ref = len(evaluation.prompts), len(reference.prompts)
        halved = (n_eval, n_ref) != (args.n_examples, args.n_reference)
        rule = (f"fewer than --n-examples {args.n_examples} + --n-reference {args.n_reference} readable records: "
                "split in half, the first half evaluated" if halved else
                "the first --n-examples readable records evaluated, the next --n-reference for the reference means")
        splits[name] = {"evaluated": n_eval, "reference": n_ref, "rule": rule}
        logger.info("%s: %d examples evaluated (readable records 1-%d), %d give the reference means (%d-%d)%s", name,
                    n_eval, n_eval, n_ref, n_eval + 1, n_eval + n_ref,
                    f"; {rule}" if halved else "")
    if suites:
        logger.info("tasks: %s (task suites: %d evaluation and %d reference examples each, from disjoint seeds) and "
                    "%s (--data; --tasks none runs them alone)", ", ".join(suites), args.n_examples, args.n_reference,
                    ", ".join(sets))
    return splits


def _read_json(path: Path, flag: str):
    return read_json_file(path, flag)


def _check_patching(patching, model, args: argparse.Namespace) -> None:
    """Read the patching head set(s) as `add_patching_overlap` will, so their errors come first."""
    from collections.abc import Mapping

    from vlens.ablation.overlap import head_set_from_json

    n_layers, n_heads = model.cfg.n_layers, model.cfg.max_heads
    per_task = patching.get("tasks") if isinstance(patching, Mapping) else None
    named = [t.strip() for t in args.tasks.split(",") if t.strip()]
    if per_task is None and isinstance(patching, Mapping) and set(patching) & set(named):
        per_task = {task: patching[task] for task in named if task in patching}
    for data in (per_task.values() if isinstance(per_task, Mapping) else [patching]):
        head_set_from_json(data, n_layers, n_heads, args.top_k, args.patching_metric)

"""`vlens ablate`: per-task head importance by ablation and the Jaccard overlap across tasks.

    vlens ablate --model tiny --tasks counting,colour,spatial,arithmetic --top-k 20 --out ablation.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from vlens.ablation.hooks import METHODS
from vlens.ablation.reference import ALIGNMENTS
from vlens.ablation.results import RANK_BY
from vlens.ablation.study import DEFAULT_TASKS, REFERENCE_MODES, ablation_study, add_patching_overlap
from vlens.finite import add_allow_nan_argument, collect_non_finite, non_finite_exit
from vlens.info_cli import load_model_arg
from vlens.validation import arg_int, check_output_file, check_top_k


def add_cli(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "ablate", help="Ablate every attention head per task; rank heads; Jaccard of top-k sets across tasks.",
        description="Ablate each head alone (on hook_z) on task-suite examples, rank heads by the drop in "
                    "answer log-probability (or accuracy) per task, and compare the tasks' top-k head sets "
                    "by Jaccard similarity.",
    )
    parser.add_argument("--model", default="tiny", help="'tiny' (embedded model), 'random-tiny', or a path / hub id")
    parser.add_argument("--tasks", default=",".join(DEFAULT_TASKS),
                        help="comma-separated tasks, TASK or TASK@STYLE (e.g. counting@synreal); "
                             f"default {','.join(DEFAULT_TASKS)}")
    parser.add_argument("--top-k", type=arg_int(min=1), default=20, help="size of each task's head set (default 20)")
    parser.add_argument("--method", choices=METHODS, default="mean", help="ablation (default mean)")
    parser.add_argument("--alignment", choices=ALIGNMENTS, default="region",
                        help="how reference means are aligned: one mean over all positions, per position "
                             "from the end, or per token region (default region)")
    parser.add_argument("--reference", choices=REFERENCE_MODES, default="per-task",
                        help="reference set: each task's own held-out examples, or all tasks' pooled")
    parser.add_argument("--rank-by", choices=RANK_BY, default="logprob", help="damage metric for the ranking")
    parser.add_argument("--n-examples", type=arg_int(min=1), default=64, help="evaluation examples per task")
    parser.add_argument("--n-reference", type=arg_int(min=1), default=64, help="reference examples per task (other seeds)")
    parser.add_argument("--image-size", type=arg_int(min=28), default=224,
                        help="rendered image size in pixels (the processor resizes: 168 px on the embedded model)")
    parser.add_argument("--batch-size", type=arg_int(min=1), default=16)
    parser.add_argument("--heads-per-pass", type=arg_int(min=1), default=8, help="heads of one layer run in one stacked batch")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--retest-seed", type=int, default=None,
                        help="also sweep a second evaluation set from this seed and report, per task, the Jaccard "
                             "of the two top-k sets (reliability); use a seed >= seed + n-examples")
    parser.add_argument("--device", default=None, help="e.g. cuda (default: where the model loads)")
    parser.add_argument("--patching", type=Path, default=None,
                        help="JSON of a VAP head sweep (head score grid or head list, optionally per task): "
                             "also report its Jaccard with each task's ablation set")
    parser.add_argument("--patching-metric", default=None,
                        help="grid of the patching JSON that ranks heads (default patch_effect, then overwrite_rate)")
    parser.add_argument("--out", type=Path, default=Path("ablation.json"), help="JSON output (default ablation.json)")
    parser.add_argument("--html", type=Path, default=None,
                        help="also write an HTML report (Jaccard heatmap, per-task damage heatmaps, top heads)")
    parser.add_argument("--markdown", type=Path, default=None,
                        help="also write the Jaccard matrix and top heads as Markdown tables (e.g. for a model card)")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    add_allow_nan_argument(parser)
    parser.set_defaults(func=run_ablate)


def run_ablate(args: argparse.Namespace) -> int:
    tasks = [t for t in args.tasks.split(",") if t.strip()]
    if not tasks:
        raise SystemExit("--tasks is empty: give e.g. --tasks counting,colour")
    if args.patching is not None and not args.patching.is_file():
        raise SystemExit(f"--patching {args.patching}: no such file")
    for flag, path in (("--out", args.out), ("--html", args.html), ("--markdown", args.markdown)):
        if path is not None:
            check_output_file(path, flag)
    patching = json.loads(args.patching.read_text()) if args.patching is not None else None
    model = load_model_arg(args.model)
    check_top_k(args.top_k, "--top-k", model.cfg.n_layers * model.cfg.n_heads)  # before the sweep
    if patching is not None:  # a wrong --patching-metric or grid fails now, not after the sweep
        _check_patching(patching, model, args)
    if args.device:
        model.to(args.device)
    with collect_non_finite() as problems:
        report = ablation_study(
            model, tasks, n_examples=args.n_examples, n_reference=args.n_reference, method=args.method,
            alignment=args.alignment, reference_mode=args.reference, top_k=args.top_k, rank_by=args.rank_by,
            image_size=args.image_size, batch_size=args.batch_size, heads_per_pass=args.heads_per_pass,
            seed=args.seed, retest_seed=args.retest_seed, progress=not args.quiet,
        )
    report.settings["model_arg"] = args.model
    if args.patching is not None:
        add_patching_overlap(report, patching, source=str(args.patching), metric=args.patching_metric)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    report.to_json(args.out)
    if args.html is not None:
        report.html_report().write(args.html)
    if args.markdown is not None:
        args.markdown.write_text(report.to_markdown())
    print(report.summary())
    print("wrote " + ", ".join(str(p) for p in (args.out, args.html, args.markdown) if p is not None))
    return non_finite_exit(problems, args.allow_nan, "vlens ablate")


def _check_patching(patching, model, args: argparse.Namespace) -> None:
    """Read the patching head set(s) as `add_patching_overlap` will, so their errors come first."""
    from collections.abc import Mapping

    from vlens.ablation.overlap import head_set_from_json

    n_layers, n_heads = model.cfg.n_layers, model.cfg.n_heads
    per_task = patching.get("tasks") if isinstance(patching, Mapping) else None
    named = [t.strip() for t in args.tasks.split(",") if t.strip()]
    if per_task is None and isinstance(patching, Mapping) and set(patching) & set(named):
        per_task = {task: patching[task] for task in named if task in patching}
    for data in (per_task.values() if isinstance(per_task, Mapping) else [patching]):
        head_set_from_json(data, n_layers, n_heads, args.top_k, args.patching_metric)

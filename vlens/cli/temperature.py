"""`vlens temperature`: fit head temperatures from an importance result, apply them, export them.

vlens temperature fit --result ablation.json --task counting --top-k 8 --out temps.json
vlens temperature apply --model tiny --temps temps.json --data data/synreal --out runs/temp
vlens temperature export --model PATH --temps temps.json --out hf_with_temperature/
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from vlens.finite import add_allow_nan_argument, collect_non_finite, non_finite_exit
from vlens.validation import arg_float, arg_int, check_output_file, check_output_folder


def add_cli(subparsers) -> None:
    parser = subparsers.add_parser(
        "temperature",
        help="adaptive head temperature: fit, apply, export",
        description="beta_h = alpha * gamma_h on the attention logits of target heads (PAPER.md section 5).",
    )
    commands = parser.add_subparsers(dest="temperature_command", metavar="SUBCOMMAND")

    fit = commands.add_parser("fit", help="temperatures from an ablation or patching result file")
    fit.add_argument(
        "--result",
        required=True,
        type=Path,
        help="JSON of `vlens ablate` (AblationReport / HeadAblation) or a layer-head patching sweep",
    )
    fit.add_argument("--task", help="the task of an ablation report holding several")
    fit.add_argument(
        "--metric",
        help="ablation: logprob (default) or accuracy; patching: a metric name (default overwrite_rate)",
    )
    fit.add_argument("--top-k", type=arg_int(min=1), default=8, help="number of heads (default 8)")
    fit.add_argument("--heads", help="explicit heads instead of top-k, e.g. 'L3H1,L2H0'")
    fit.add_argument("--alpha", type=arg_float(min=0, min_open=True), default=1.2)
    fit.add_argument("--normalisation", choices=["max", "mean", "none"], default="max")
    fit.add_argument("--floor", type=arg_float(min=0, min_open=True), default=1.0, help="smallest beta (default 1: never soften)")
    fit.add_argument("--no-floor", action="store_true", help="the bare formula beta = alpha * gamma")
    fit.add_argument("--out", required=True, type=Path)
    add_allow_nan_argument(fit)
    fit.set_defaults(func=run_fit)

    apply = commands.add_parser("apply", help="evaluate a model with the temperatures on an imagefolder set")
    apply.add_argument("--model", default="tiny", help="'tiny', 'random-tiny' or a path / hub id")
    apply.add_argument("--temps", required=True, type=Path)
    apply.add_argument("--data", required=True, type=Path, help="a vlens imagefolder (counting)")
    apply.add_argument("--limit", type=arg_int(min=1))
    apply.add_argument("--batch-size", type=arg_int(min=1), default=16)
    apply.add_argument("--max-new-tokens", type=arg_int(min=1), default=8)
    apply.add_argument("--out", type=Path, help="write the report (with and without temperature) here")
    add_allow_nan_argument(apply)
    apply.set_defaults(func=run_apply)

    export = commands.add_parser(
        "export",
        help="write an HF checkpoint with the temperatures baked into q_proj (families without q norm)",
    )
    export.add_argument("--model", default="tiny")
    export.add_argument("--temps", required=True, type=Path)
    export.add_argument("--out", required=True, type=Path)
    export.add_argument("--overwrite", action="store_true", help="replace a model folder already in --out")
    export.set_defaults(func=run_export)
    parser.set_defaults(func=lambda args: (parser.print_help(), 1)[1])


def _parse_heads(text: str) -> list[tuple[int, int]]:
    heads = []
    for item in text.split(","):
        layer, _, head = item.strip().upper().removeprefix("L").partition("H")
        if not layer.isdigit() or not head.isdigit():
            raise SystemExit(f"cannot read head {item!r}: write heads as L<layer>H<head>, e.g. L3H1,L2H0")
        heads.append((int(layer), int(head)))
    return heads


def run_fit(args: argparse.Namespace) -> int:
    from vlens.interventions.temperature import fit_temperature, importance_from_result

    check_output_file(args.out, "--out")
    importance = importance_from_result(args.result, task=args.task, metric=args.metric)
    with collect_non_finite() as problems:
        temp = fit_temperature(
            importance,
            heads=_parse_heads(args.heads) if args.heads else None,
            top_k=args.top_k,
            alpha=args.alpha,
            normalisation=args.normalisation,
            floor=None if args.no_floor else args.floor,
            source={"result": str(args.result), "task": args.task, "metric": args.metric},
        )
    temp.save(args.out)
    for entry in temp.to_json()["heads"]:
        print(f"L{entry['layer']}H{entry['head']}: gamma {entry['gamma']:.3f} -> beta {entry['beta']:.3f}")
    print(f"wrote {args.out}")
    return non_finite_exit(problems, args.allow_nan, "vlens temperature fit")


def run_apply(args: argparse.Namespace) -> int:
    from vlens.evaluation import HookedVLMBackend, evaluate, read_counting_imagefolder
    from vlens.info_cli import load_model_arg
    from vlens.interventions.temperature import HeadTemperature

    if args.out is not None:
        check_output_folder(args.out, "--out")
    temp = HeadTemperature.from_json(args.temps)
    data = read_counting_imagefolder(args.data)
    model = load_model_arg(args.model)
    summary = {}
    problems: list[str] = []
    for label, hooks in (("without", []), ("with", temp.hooks(model))):
        with collect_non_finite() as found:
            result = evaluate(
                HookedVLMBackend(model, fwd_hooks=hooks),
                data,
                batch_size=args.batch_size,
                max_new_tokens=args.max_new_tokens,
                limit=args.limit,
            )
        problems += found
        summary[label] = {
            "accuracy": result.metrics.accuracy,
            "mae": result.metrics.mae,
            "n": result.metrics.n,
        }
        print(f"{label} temperature: accuracy {result.metrics.accuracy:.3f}, MAE {result.metrics.mae}")
        if args.out:
            from vlens.evaluation import write_report

            write_report(
                result,
                args.out / f"{label}_temperature",
                model_name=f"{args.model} ({label} temperature)",
                figures=False,
            )
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "summary.json").write_text(
            json.dumps({"temperature": temp.to_json(), **summary}, indent=1) + "\n"
        )
    return non_finite_exit(problems, args.allow_nan, "vlens temperature apply")


def run_export(args: argparse.Namespace) -> int:
    from vlens.fileio import atomic_folder
    from vlens.info_cli import load_model_arg
    from vlens.interventions.temperature import HeadTemperature

    check_output_folder(args.out, "--out", overwrite=args.overwrite, model_folder=True)  # before any work
    temp = HeadTemperature.from_json(args.temps)
    model = load_model_arg(args.model)
    try:
        state = temp.baked_state_dict(model.hf_model)
    except ValueError as err:
        print(f"vlens temperature export: error: {err}", file=sys.stderr)
        return 2
    # a new folder replaces the old one whole, only once everything is written (no stale card or weights)
    with atomic_folder(args.out, overwrite=args.overwrite, name="--out") as staging:
        model.hf_model.save_pretrained(str(staging), state_dict=state)
        if model.processor is not None and hasattr(model.processor, "save_pretrained"):
            model.processor.save_pretrained(str(staging))
        temp.save(staging / "vlens_temperature.json")
    print(f"wrote {args.out} (temperatures baked into q_proj of layers {temp.layers})")
    return 0

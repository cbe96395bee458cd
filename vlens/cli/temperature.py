"""`vlens temperature`: fit head temperatures from an importance result, apply them, export them.

    vlens temperature fit --result runs/ablation/results.json --task counting --top-k 8 --out runs/temps
    vlens temperature fit --select taxonomy --taxonomy runs/headlens --result runs/ablation --task counting --out runs/t
    vlens temperature apply --model tiny --temps runs/temps --data data/synreal --out runs/temp_eval
    vlens temperature export --model PATH --temps runs/temps --out hf_with_temperature/

`fit` writes the temperatures to ``results.json`` in its ``--out`` folder; ``--temps`` takes that
folder (or the JSON file itself).
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
    checked_by,
    load_model_from_args,
    prepare_out,
    write_results,
)
from vlens.utils.errors import UserInputError
from vlens.utils.finite import add_allow_nan_argument
from vlens.utils.validation import arg_float, arg_int, arg_path, check_count

logger = logging.getLogger(__name__)

BAKED_TEMPS = "vlens_temperature.json"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = ("Adaptive head temperature: beta_h = alpha * gamma_h scales the attention logits of "
                          "target heads (see docs/ in the repository).")
    commands = parser.add_subparsers(dest="temperature_command", metavar="SUBCOMMAND", required=True)

    fit = commands.add_parser("fit", help="temperatures from an ablation or patching result file")
    result = fit.add_argument(
        "--result",
        type=arg_path,
        default=None,
        help="results.json of `vlens ablate` (AblationReport / HeadAblation) or of a layer-head `vlens patch`, "
        "or that command's --out folder: the importance gamma (needed with --select importance)",
    )
    fit.add_argument("--select", choices=("importance", "taxonomy"), default="importance",
                     help="which heads: the --top-k most important (default), or the paper's target classes of a "
                     "HeadLens taxonomy (--taxonomy; gamma from --result when given, else 1)")
    taxonomy = fit.add_argument("--taxonomy", type=arg_path, default=None,
                     help="results.json (or --out folder) of `vlens headlens`, for --select taxonomy")
    mark_input_paths(fit, result.dest, taxonomy.dest)
    fit.add_argument("--classes", default=",".join(("cross-modal routing", "counting aggregation")),
                     help="head classes for --select taxonomy, comma-separated (default: cross-modal routing,"
                     "counting aggregation)")
    fit.add_argument("--stable-only", action="store_true",
                     help="--select taxonomy: only heads whose class is stable over resampled examples")
    fit.add_argument("--task", help="the task of an ablation report holding several")
    fit.add_argument(
        "--metric",
        help="ablation: logprob (default) or accuracy; patching: a metric name (default overwrite_rate)",
    )
    fit.add_argument("--top-k", type=arg_int(min=1), default=8, help="number of heads (default 8)")
    fit.add_argument("--heads", type=checked_by(_parse_heads), help="explicit heads instead of top-k, e.g. 'L3H1,L2H0'")
    fit.add_argument("--alpha", type=arg_float(min=0, min_open=True), default=1.2,
                     help="scale of the temperatures: beta = alpha * gamma (gamma: the head's normalised importance)")
    fit.add_argument("--normalisation", choices=["max", "mean", "none"], default="max",
                     help="gamma = importance divided by the chosen heads' max or mean importance, or the raw importance")
    fit.add_argument("--floor", type=arg_float(min=0, min_open=True), default=1.0,
                     help="smallest beta (default 1: never soften)")
    fit.add_argument("--no-floor", action="store_true", help="the bare formula beta = alpha * gamma")
    add_out(fit, f"{RESULTS_FILE} (the temperatures, for --temps DIR)")
    add_allow_nan_argument(fit)
    fit.set_defaults(func=run_fit)

    apply = commands.add_parser("apply", help="evaluate a model with the temperatures on an imagefolder set")
    add_model_options(apply)
    temps = apply.add_argument("--temps", required=True, type=arg_path, help="a `temperature fit` folder (or its JSON)")
    mark_input_paths(apply, temps.dest)
    add_data_arguments(apply, required=True, help="counting or multiple-choice set (any --format)")
    apply.add_argument("--limit", type=arg_int(min=1), help="evaluate only the first N examples")
    add_batch_size(apply, 16, "examples per generate call")
    apply.add_argument("--max-new-tokens", type=arg_int(min=1), default=8, help="tokens generated per answer")
    add_out(apply, f"{RESULTS_FILE} (both accuracies) and one evaluation report per condition "
                   "(with_temperature/, without_temperature/); without --out only the summary is printed",
            required=False)
    add_allow_nan_argument(apply)
    apply.set_defaults(func=run_apply)

    export = commands.add_parser(
        "export",
        help="write an HF checkpoint with the temperatures baked into q_proj (families without q norm)",
    )
    add_model_options(export, dtype_default="float32")
    temps = export.add_argument("--temps", required=True, type=arg_path, help="a `temperature fit` folder (or its JSON)")
    mark_input_paths(export, temps.dest)
    add_out(export, f"the HF checkpoint (safetensors, processor) and {BAKED_TEMPS}")
    export.set_defaults(func=run_export)


def temps_file(path: Path) -> Path:
    """The results.json of a command's --out folder (a `temperature fit`, `ablate` or `patch` run), or the file itself."""
    return path / RESULTS_FILE if path.is_dir() else path


def _parse_heads(text: str) -> list[tuple[int, int]]:
    heads = []
    for item in text.split(","):
        layer, _, head = item.strip().upper().removeprefix("L").partition("H")
        if not layer.isdigit() or not head.isdigit():
            raise UserInputError(f"cannot read head {item!r}: write heads as L<layer>H<head>, e.g. L3H1,L2H0")
        heads.append((int(layer), int(head)))
    return heads


def run_fit(args: argparse.Namespace) -> int:
    from vlens.interventions.temperature import fit_temperature, importance_from_result, taxonomy_heads
    from vlens.utils.finite import collect_non_finite

    heads = _parse_heads(args.heads) if args.heads else None
    if args.select == "taxonomy":
        if args.taxonomy is None:
            raise UserInputError("--select taxonomy needs --taxonomy DIR (the --out folder of `vlens headlens`)")
        if heads is not None:
            raise UserInputError("--heads and --select taxonomy both choose the heads: give one of them")
    elif args.result is None:
        raise UserInputError("--select importance needs --result (an ablation or layer-head patching result)")
    out = prepare_out(args, RESULTS_FILE)
    importance = (importance_from_result(temps_file(args.result), task=args.task, metric=args.metric)
                  if args.result is not None else None)
    if args.select == "taxonomy":
        classes = [c.strip() for c in args.classes.split(",") if c.strip()]
        heads = taxonomy_heads(args.taxonomy, classes, stable_only=args.stable_only)
        if not heads:
            raise UserInputError(f"the taxonomy {args.taxonomy} has no {'stable ' if args.stable_only else ''}head of "
                                 f"the classes {classes}: nothing to sharpen")
    elif heads is None:  # more heads than the result scores would quietly take every positive one
        assert importance is not None
        check_count(args.top_k, "--top-k", max=importance.numel())
    source = {"result": None if args.result is None else str(args.result), "task": args.task, "metric": args.metric,
              "selection": args.select}
    if args.select == "taxonomy":
        source.update(taxonomy=str(args.taxonomy), classes=classes, stable_only=args.stable_only)
    with collect_non_finite() as problems:
        temp = fit_temperature(
            importance,
            heads=heads,
            top_k=args.top_k,
            alpha=args.alpha,
            normalisation=args.normalisation,
            floor=None if args.no_floor else args.floor,
            source=source,
        )
    temp.save(out / RESULTS_FILE)
    echo(temp.summary())
    logger.info("wrote %s", out / RESULTS_FILE)
    return non_finite_exit(problems, args.allow_nan, "vlens temperature fit")


def run_apply(args: argparse.Namespace) -> int:
    from vlens.evaluation import EvalSettings, HookedVLMBackend, evaluate, get_format, write_report
    from vlens.evaluation.datasets import check_counting
    from vlens.interventions.temperature import EvalFigures, HeadTemperature, TemperatureComparison
    from vlens.parallel.options import SweepOptions
    from vlens.utils.finite import collect_non_finite

    out = prepare_out(args, RESULTS_FILE) if args.out is not None else None
    temp = HeadTemperature.load(temps_file(args.temps))
    data = load_data_arg(args, args.data, args.limit)
    if get_format(data.format).task == "count":
        check_counting(data)
    model = load_model_from_args(args)
    summary: dict[str, EvalFigures] = {}
    problems: list[str] = []
    for label, hooks in (("without", []), ("with", temp.hooks(model))):
        with collect_non_finite() as found:
            result = evaluate(
                HookedVLMBackend(model, fwd_hooks=hooks),
                data,
                settings=EvalSettings(max_new_tokens=args.max_new_tokens, limit=args.limit),
                options=SweepOptions(batch_size=args.batch_size, progress=not args.quiet),
            )
        problems += found
        mae = getattr(result.metrics, "mae", None)
        summary[label] = EvalFigures(accuracy=result.metrics.accuracy, mae=mae, n=result.metrics.n)
        echo(f"{label} temperature: accuracy {result.metrics.accuracy:.3f}, MAE {mae} "
              f"(post-prompt {result.settings['post_prompt']!r})")
        if out is not None:
            write_report(result, out / f"{label}_temperature", model_name=f"{args.model} ({label} temperature)",
                         figures=False)
    if out is not None:
        write_results(out, TemperatureComparison(temp, summary["without"], summary["with"]).to_dict())
        logger.info("wrote %s", out)
    return non_finite_exit(problems, args.allow_nan, "vlens temperature apply")


def run_export(args: argparse.Namespace) -> int:
    from vlens.interventions.temperature import HeadTemperature
    from vlens.utils.fileio import atomic_folder
    from vlens.utils.validation import check_output_folder

    check_output_folder(args.out, "--out", overwrite=args.overwrite, model_folder=True)  # before any work
    temp = HeadTemperature.load(temps_file(args.temps))
    model = load_model_from_args(args)
    try:
        state = temp.baked_state_dict(model.hf_model)
    except ValueError as error:  # a family whose queries are normalised cannot take the scale in q_proj
        raise UserInputError(str(error)) from error
    # a new folder replaces the old one whole, only once everything is written (no stale card or weights)
    with atomic_folder(args.out, overwrite=args.overwrite, name="--out") as staging:
        model.hf_model.save_pretrained(str(staging), state_dict=state)
        if model.processor is not None and hasattr(model.processor, "save_pretrained"):
            model.processor.save_pretrained(str(staging))
        temp.save(staging / BAKED_TEMPS)
    logger.info("wrote %s (temperatures baked into q_proj of layers %s)", args.out, temp.layers)
    return 0

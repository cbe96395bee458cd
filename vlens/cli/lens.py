"""``vlens lens train`` and ``vlens headlens``.

    vlens lens train --model tiny --make 300 --out lenses/tiny
    vlens headlens --model tiny --make 200 --out runs/headlens            # trains a lens first
    vlens headlens --model tiny --data data/tasks --lens lenses/tiny --out runs/headlens

``--data DIR`` reads an imagefolder (``vlens data tasks --out DIR``); ``--make N`` generates N
task-suite samples on the fly. ``vlens lens train`` writes a lens folder (config.json +
translators.safetensors). ``vlens headlens`` writes ``results.json`` (per head: layer, head,
scores, class, top tokens), ``taxonomy.md``, ``taxonomy.html`` (with plotly) and, when it trains
the lens, ``lens/`` and ``lens_kl.json``.
"""

from __future__ import annotations

import argparse
import json
import logging

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
    style_arg,
    task_names_arg,
    write_figure,
    write_results,
)
from vlens.utils.errors import UserInputError
from vlens.utils.fileio import read_json_file
from vlens.utils.finite import add_allow_nan_argument
from vlens.utils.validation import arg_float, arg_int, arg_path

logger = logging.getLogger(__name__)

LENS_SEED_OFFSET = 1_000_003  # lens-training samples never coincide with scored samples
TAXONOMY_MD, TAXONOMY_HTML, LENS_KL, LENS_DIR = "taxonomy.md", "taxonomy.html", "lens_kl.json", "lens"


def _data_args(parser: argparse.ArgumentParser) -> None:
    add_model_options(parser, render_default="model")
    source = parser.add_mutually_exclusive_group(required=True)
    add_data_arguments(parser, group=source, help="dataset with a question per image (vlens data tasks --out DIR, "
                       "PixMo-Count, CountBenchQA, multiple choice, qa rows; see --format)")
    source.add_argument("--make", type=arg_int(min=1), metavar="N", help="generate N task-suite samples on the fly")
    parser.add_argument("--limit", type=arg_int(min=1), default=None, help="use at most this many images of --data")
    parser.add_argument("--seed", type=arg_int(min=0), default=0, help="seed of generated samples (default 0)")
    parser.add_argument("--style", type=style_arg, default="synpoly", help="style of generated samples (default synpoly)")
    parser.add_argument("--tasks", type=task_names_arg, default=None,
                        help="comma-separated tasks of generated samples (default: all task suites)")
    add_batch_size(parser, 8)


def _train_args(parser: argparse.ArgumentParser, prefix: str = "") -> None:
    parser.add_argument(f"--{prefix}steps", type=arg_int(min=1), default=300,
                        help="translator training steps (default 300)")
    parser.add_argument(f"--{prefix}lr", type=arg_float(min=0, min_open=True), default=1e-3,
                        help="Adam learning rate (default 1e-3)")
    parser.add_argument(f"--{prefix}positions", choices=("text", "final", "all"), default="text",
                        help="training positions: all text positions (default), final positions, or all")


def configure_lens(lens: argparse.ArgumentParser) -> None:
    """`vlens lens train`."""
    lens_sub = lens.add_subparsers(dest="lens_command", metavar="LENS_COMMAND", required=True)
    train = lens_sub.add_parser("train", help="train per-layer translators (tuned-lens form) on images + prompts",
                                description="Train per-layer translators (tuned-lens form) on images + prompts.")
    _data_args(train)
    _train_args(train)
    add_out(train, "the lens (config.json + translators.safetensors), for vlens headlens --lens DIR; written "
                   "whole or not at all")
    train.set_defaults(func=run_lens_train)


def configure_headlens(head: argparse.ArgumentParser) -> None:
    """`vlens headlens`."""
    _data_args(head)
    add_out(head, f"{RESULTS_FILE} (per head: scores, class, top tokens), {TAXONOMY_MD}, {TAXONOMY_HTML}; "
                  f"with a lens trained here also {LENS_DIR}/ and {LENS_KL}")
    lens = head.add_argument("--lens", default=None, help="a trained lens folder; default: train one first")
    head.add_argument("--lens-make", type=arg_int(min=1), default=300,
                      help="task samples to train the lens on when --lens is not given (default 300)")
    lens_data = head.add_argument("--lens-data", type=arg_path, default=None,
                      help="a dataset to train the lens on instead (read with the --format / --split / --image-dir "
                           "options; at most --lens-make rows); use rows other than --data's")
    mark_input_paths(head, lens.dest, lens_data.dest)
    _train_args(head, prefix="lens-")
    head.add_argument("--k", type=arg_int(min=1), default=10, help="top-k tokens per head (default 10)")
    head.add_argument("--vocab", default=None,
                      help="JSON file {name: [words]} replacing vocabularies (visual, number, existence, difficulty)")
    head.add_argument("--thresholds", default=None,
                      help="JSON file overriding taxonomy thresholds, e.g. {\"grounding_vgs_min\": 0.4} "
                           "(fields of vlens.lens.taxonomy.TaxonomyThresholds)")
    add_allow_nan_argument(head)
    head.set_defaults(func=run_headlens, shardable=True)  # torchrun splits the batches (vlens.parallel)


def _samples(args: argparse.Namespace):
    from vlens.lens.corpus import dataset_samples, task_samples

    if args.data is not None:
        return dataset_samples(load_data_arg(args, args.data, args.limit), limit=args.limit)
    return task_samples(args.make, seed=args.seed, size=rendered_size(args), style=args.style,
                        tasks=_tasks(args))


def _tasks(args: argparse.Namespace) -> tuple[str, ...] | None:
    from vlens.data import TASKS

    if args.tasks is None:
        return None
    tasks = tuple(t.strip() for t in args.tasks.split(",") if t.strip())
    unknown = [t for t in tasks if t not in TASKS]
    if unknown or not tasks:
        raise UserInputError(f"unknown task(s) {unknown} in --tasks; choose from {','.join(TASKS)}")
    return tasks


def _train(model, samples, args, steps, lr, positions):
    """Collect residuals (split across processes under torchrun), train the lens on rank 0, and
    give every rank that lens (so that all score the heads with the same translators)."""
    from vlens.lens.corpus import collect_residuals
    from vlens.lens.readout import LensReadout
    from vlens.lens.translators import LensTraining, TrainingReport, Translators, train_translators
    from vlens.parallel.options import SweepOptions

    sharding = args.sharding
    resid = collect_residuals(model, samples, positions=positions, options=SweepOptions(
        batch_size=args.batch_size, progress=not args.quiet, sharding=sharding))
    translators = Translators.for_model(model)
    trained = None
    if sharding.is_main:
        report = train_translators(translators, resid, LensReadout.from_model(model),
                                   training=LensTraining(steps=steps, lr=lr), progress=not args.quiet)
        translators.info.update(training={"positions": positions, "n_samples": len(samples), **report.to_dict()})
        trained = (translators.state_dict(), translators.info, report.to_dict())
    state, info, report_json = sharding.broadcast(trained, desc="lens training")
    if not sharding.is_main:
        translators.load_state_dict(state)
        translators.info.update(info)
    return translators, TrainingReport.from_dict(report_json)


def run_lens_train(args: argparse.Namespace) -> int:
    from vlens.utils.validation import check_output_folder

    _tasks(args)  # what the user typed is checked before anything is written or loaded
    # the lens folder is replaced whole (an existing lens needs --overwrite; other files are never mixed in)
    check_output_folder(args.out, "--out", overwrite=args.overwrite, model_folder=True)
    model = load_model_from_args(args)
    translators, report = _train(model, _samples(args), args, args.steps, args.lr, args.positions)
    out = translators.save(args.out, overwrite=args.overwrite)
    echo(report.table())
    logger.info("saved lens to %s", out)
    return 0


def _read_json_file(path: str, flag: str):
    return read_json_file(path, flag)


def _load_vocab(path: str | None):
    if path is None:
        return None
    from vlens.lens.vocabularies import DEFAULT_VOCABULARIES

    data = _read_json_file(path, "--vocab")
    if not isinstance(data, dict) or not all(isinstance(v, list) for v in data.values()):
        raise UserInputError(f"--vocab {path} must hold a JSON object {{name: [words]}}")
    return {**DEFAULT_VOCABULARIES, **data}


def _load_thresholds(path: str | None):
    from vlens.lens.taxonomy import TaxonomyThresholds

    if path is None:
        return TaxonomyThresholds()
    data = _read_json_file(path, "--thresholds")
    if not isinstance(data, dict):
        raise UserInputError(f"--thresholds {path} must hold a JSON object {{threshold: value}}")
    try:
        return TaxonomyThresholds.from_dict(data)
    except ValueError as error:
        raise UserInputError(f"--thresholds {path}: {error}") from None


def run_headlens(args: argparse.Namespace) -> int:
    from vlens.lens.corpus import task_samples
    from vlens.lens.head_scores import compute_head_scores
    from vlens.lens.headlens import HeadLens
    from vlens.lens.taxonomy import classify_heads
    from vlens.lens.translators import Translators
    from vlens.parallel.options import SweepOptions
    from vlens.utils.finite import collect_non_finite

    _tasks(args)
    vocabularies = _load_vocab(args.vocab)
    thresholds = _load_thresholds(args.thresholds)
    out = prepare_out(args, RESULTS_FILE, TAXONOMY_MD, TAXONOMY_HTML, *([] if args.lens else [LENS_KL]))
    model = load_model_from_args(args)
    samples = _samples(args)
    if args.lens is not None:
        translators = Translators.load(args.lens, model=model)
    else:
        if args.lens_data is not None:
            from vlens.lens.corpus import dataset_samples

            lens_samples = dataset_samples(load_data_arg(args, args.lens_data), limit=args.lens_make)
        else:
            lens_samples = task_samples(args.lens_make, seed=args.seed + LENS_SEED_OFFSET,
                                        size=rendered_size(args), style=args.style,
                                        tasks=_tasks(args))
        translators, report = _train(model, lens_samples, args, args.lens_steps, args.lens_lr, args.lens_positions)
        if args.sharding.is_main:
            translators.save(out / LENS_DIR, overwrite=True)  # this command's own sub-folder
            (out / LENS_KL).write_text(json.dumps(report.to_dict(), indent=2) + "\n", encoding="utf-8")
        echo("per-layer KL(final || lens), held-out, nats:")
        echo(report.table())
    with collect_non_finite() as problems:
        scores = compute_head_scores(model, samples, HeadLens(model, translators), k=args.k,
                                     vocabularies=vocabularies, options=SweepOptions(
                                         batch_size=args.batch_size, progress=not args.quiet,
                                         sharding=args.sharding))
    if not args.sharding.is_main:  # every rank holds the scores; rank 0 writes them
        return non_finite_exit(problems, True, "vlens headlens")
    taxonomy = classify_heads(scores, thresholds)
    write_results(out, {**taxonomy.to_dict(), "world_size": args.sharding.world_size})
    (out / TAXONOMY_MD).write_text(taxonomy.table() + "\n", encoding="utf-8")
    write_figure(taxonomy.plot, out / TAXONOMY_HTML)
    echo(f"{scores.n_examples} examples; classes: {taxonomy.counts()}"
         + ("" if taxonomy.stability is None else f"; {int(taxonomy.stability.unstable.sum())} heads unstable over "
            f"{taxonomy.stability.n_resamples} resamples of the examples"))
    echo(taxonomy.table())
    logger.info("wrote %s", out / RESULTS_FILE)
    return non_finite_exit(problems, args.allow_nan, "vlens headlens")

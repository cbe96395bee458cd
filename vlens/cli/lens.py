"""``vlens lens train`` and ``vlens headlens``.

    vlens lens train --model tiny --make 300 --out lenses/tiny
    vlens headlens --model tiny --make 200 --out runs/headlens            # trains a lens first
    vlens headlens --model tiny --data data/tasks --lens lenses/tiny --out runs/headlens

``--data DIR`` reads an imagefolder (``vlens data tasks --out DIR``); ``--make N`` generates N
task-suite samples on the fly. ``vlens headlens`` writes ``heads.json`` (per head: layer,
head, scores, class, top tokens), ``taxonomy.md``, ``taxonomy.html`` (with plotly) and,
when it trains the lens, ``lens/`` and ``lens_kl.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from vlens.finite import add_allow_nan_argument, collect_non_finite, json_safe, non_finite_exit
from vlens.validation import arg_float, arg_int, check_output_folder

LENS_SEED_OFFSET = 1_000_003  # lens-training samples never coincide with scored samples


def _data_args(parser: argparse.ArgumentParser) -> None:
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--data", help="imagefolder with a 'question' per image (vlens data tasks --out DIR)")
    source.add_argument("--make", type=arg_int(min=1), metavar="N", help="generate N task-suite samples on the fly")
    parser.add_argument("--limit", type=arg_int(min=1), default=None, help="use at most this many images of --data")
    parser.add_argument("--seed", type=int, default=0, help="seed of generated samples (default 0)")
    parser.add_argument("--size", type=arg_int(min=28), default=168, help="image size of generated samples (default 168)")
    parser.add_argument("--style", default="synpoly", help="style of generated samples (default synpoly)")
    parser.add_argument("--tasks", default=None,
                        help="comma-separated tasks of generated samples (default: all task suites)")
    parser.add_argument("--model", default="tiny", help="'tiny' (embedded), 'random-tiny', or a path / hub id")
    parser.add_argument("--batch-size", type=arg_int(min=1), default=8)
    parser.add_argument("--quiet", action="store_true", help="no progress bars")


def _train_args(parser: argparse.ArgumentParser, prefix: str = "") -> None:
    parser.add_argument(f"--{prefix}steps", type=arg_int(min=1), default=300, help="translator training steps (default 300)")
    parser.add_argument(f"--{prefix}lr", type=arg_float(min=0, min_open=True), default=1e-3, help="Adam learning rate (default 1e-3)")
    parser.add_argument(f"--{prefix}positions", choices=("text", "final", "all"), default="text",
                        help="training positions: all text positions (default), final positions, or all")


def add_cli(subparsers: argparse._SubParsersAction) -> None:
    lens = subparsers.add_parser("lens", help="Train and inspect lenses (translators).")
    lens_sub = lens.add_subparsers(dest="lens_command", metavar="LENS_COMMAND")
    train = lens_sub.add_parser("train", help="Train per-layer translators (tuned-lens form) on images + prompts.")
    _data_args(train)
    _train_args(train)
    train.add_argument("--out", required=True, help="output folder (config.json + translators.safetensors)")
    train.add_argument("--overwrite", action="store_true", help="replace a lens already in --out")
    train.set_defaults(func=run_lens_train)
    lens.set_defaults(func=lambda args: (lens.print_help(), 1)[1])

    head = subparsers.add_parser("headlens", help="HeadLens: decode every head, score it and classify it.")
    _data_args(head)
    head.add_argument("--out", required=True, help="output folder (heads.json, taxonomy.md, taxonomy.html)")
    head.add_argument("--lens", default=None, help="a trained lens folder; default: train one first")
    head.add_argument("--lens-make", type=arg_int(min=1), default=300,
                      help="task samples to train the lens on when --lens is not given (default 300)")
    _train_args(head, prefix="lens-")
    head.add_argument("--k", type=arg_int(min=1), default=10, help="top-k tokens per head (default 10)")
    head.add_argument("--vocab", default=None,
                      help="JSON file {name: [words]} replacing vocabularies (visual, number, existence, difficulty)")
    head.add_argument("--thresholds", default=None,
                      help="JSON file overriding taxonomy thresholds, e.g. {\"grounding_vgs_min\": 0.4} "
                           "(fields of vlens.lens.taxonomy.TaxonomyThresholds)")
    add_allow_nan_argument(head)
    head.set_defaults(func=run_headlens)


def _samples(args: argparse.Namespace):
    from vlens.lens.corpus import imagefolder_samples, task_samples

    if args.data is not None:
        return imagefolder_samples(args.data, limit=args.limit)
    return task_samples(args.make, seed=args.seed, size=args.size, style=args.style, tasks=_tasks(args))


def _tasks(args: argparse.Namespace) -> tuple[str, ...] | None:
    from vlens.data import TASKS

    if args.tasks is None:
        return None
    tasks = tuple(t.strip() for t in args.tasks.split(",") if t.strip())
    unknown = [t for t in tasks if t not in TASKS]
    if unknown or not tasks:
        raise ValueError(f"unknown task(s) {unknown} in --tasks; choose from {','.join(TASKS)}")
    return tasks


def _train(model, samples, args, steps, lr, positions):
    from vlens.lens.corpus import collect_residuals
    from vlens.lens.readout import LensReadout
    from vlens.lens.translators import Translators, train_translators

    resid = collect_residuals(model, samples, positions=positions, batch_size=args.batch_size,
                              progress=not args.quiet)
    translators = Translators.for_model(model)
    report = train_translators(translators, resid, LensReadout.from_model(model), steps=steps, lr=lr,
                               progress=not args.quiet)
    translators.info.update(training={"positions": positions, "n_samples": len(samples), **report.to_json()})
    return translators, report


def run_lens_train(args: argparse.Namespace) -> int:
    from vlens.info_cli import load_model_arg

    try:
        check_output_folder(args.out, "--out", overwrite=args.overwrite, model_folder=True)
        model = load_model_arg(args.model)
        translators, report = _train(model, _samples(args), args, args.steps, args.lr, args.positions)
    except (ValueError, FileNotFoundError) as err:
        print(f"vlens lens train: error: {err}", file=sys.stderr)
        return 2
    out = translators.save(args.out, overwrite=args.overwrite)
    print(report.table())
    print(f"saved lens to {out}")
    return 0


def _load_vocab(path: str | None):
    if path is None:
        return None
    from vlens.lens.vocabularies import DEFAULT_VOCABULARIES

    data = json.loads(Path(path).read_text(encoding="utf-8"))
    if not isinstance(data, dict) or not all(isinstance(v, list) for v in data.values()):
        raise ValueError(f"{path} must hold a JSON object {{name: [words]}}")
    return {**DEFAULT_VOCABULARIES, **data}


def _load_thresholds(path: str | None):
    from dataclasses import fields

    from vlens.lens.taxonomy import TaxonomyThresholds

    if path is None:
        return TaxonomyThresholds()
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    known = {f.name for f in fields(TaxonomyThresholds)}
    if not isinstance(data, dict) or set(data) - known:
        raise ValueError(f"{path} must hold a JSON object with keys among {sorted(known)}")
    return TaxonomyThresholds(**data)


def run_headlens(args: argparse.Namespace) -> int:
    from vlens.info_cli import load_model_arg
    from vlens.lens.corpus import task_samples
    from vlens.lens.head_scores import compute_head_scores
    from vlens.lens.headlens import HeadLens
    from vlens.lens.taxonomy import classify_heads
    from vlens.lens.translators import LensMismatchError, Translators

    out = Path(args.out)
    try:
        check_output_folder(out, "--out")
        vocabularies = _load_vocab(args.vocab)  # the user's files are read before the model loads
        thresholds = _load_thresholds(args.thresholds)
        model = load_model_arg(args.model)
        samples = _samples(args)
        if args.lens is not None:
            translators = Translators.load(args.lens, model=model)
        else:
            lens_samples = task_samples(args.lens_make, seed=args.seed + LENS_SEED_OFFSET, size=args.size,
                                        style=args.style, tasks=_tasks(args))
            translators, report = _train(model, lens_samples, args, args.lens_steps, args.lens_lr,
                                         args.lens_positions)
            translators.save(out / "lens", overwrite=True)  # this command's own sub-folder
            out.mkdir(parents=True, exist_ok=True)
            (out / "lens_kl.json").write_text(json.dumps(report.to_json(), indent=2) + "\n", encoding="utf-8")
            print("per-layer KL(final || lens), held-out, nats:")
            print(report.table())
        with collect_non_finite() as problems:
            scores = compute_head_scores(model, samples, HeadLens(model, translators), k=args.k,
                                         batch_size=args.batch_size, vocabularies=vocabularies,
                                         progress=not args.quiet)
    except (ValueError, FileNotFoundError, LensMismatchError) as err:
        print(f"vlens headlens: error: {err}", file=sys.stderr)
        return 2
    taxonomy = classify_heads(scores, thresholds)
    out.mkdir(parents=True, exist_ok=True)
    (out / "heads.json").write_text(json.dumps(json_safe(taxonomy.to_json()), indent=2, allow_nan=False) + "\n",
                                   encoding="utf-8")
    (out / "taxonomy.md").write_text(taxonomy.table() + "\n", encoding="utf-8")
    try:
        taxonomy.figure().write_html(str(out / "taxonomy.html"), include_plotlyjs="cdn")
    except ImportError as err:
        print(f"(no taxonomy.html: {err})", file=sys.stderr)
    print(f"{scores.n_examples} examples; classes: {taxonomy.counts()}")
    print(taxonomy.table())
    print(f"wrote {out / 'heads.json'}")
    return non_finite_exit(problems, args.allow_nan, "vlens headlens")

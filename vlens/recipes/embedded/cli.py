"""`vlens zoo ...`: train (reproduce) and evaluate the embedded model.

Only the standard library, vlens.utils.validation and the recipe's plain settings dataclasses are
imported at top level (the dispatcher builds this parser for `vlens zoo ... --help`); the
recipe, torch and transformers load when a command runs. Every numeric flag is checked while
parsing (exit 2 with one line naming the flag and its allowed range), before anything is
rendered or trained.
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

from vlens.cli.console import echo
from vlens.cli.options import MAX_IMAGE_SIZE
from vlens.recipes.embedded.settings import RecipeSettings, TrainSettings
from vlens.utils.errors import UserInputError
from vlens.utils.validation import arg_float, arg_int, arg_path

logger = logging.getLogger(__name__)
CELL = 28  # px per merged image token (vlens.zoo.processor.CELL), kept here so parsing stays light


def _image_size(text: str) -> int:
    value = arg_int(min=CELL, max=MAX_IMAGE_SIZE)(text)
    if value % CELL:
        raise argparse.ArgumentTypeError(f"must be a multiple of {CELL} px (e.g. 168 or 224), got {text!r}")
    return value


def _mrope_section(text: str) -> list[int]:
    try:
        section = [int(part) for part in text.split(",")]
    except ValueError:
        section = []
    if len(section) != 3 or min(section) < 1:
        raise argparse.ArgumentTypeError(
            f"must be three positive integers t,h,w (rotary frequencies per axis, e.g. 2,2,4), got {text!r}"
        )
    return section


def settings_from_args(args: argparse.Namespace) -> RecipeSettings:
    """The recipe's settings from parsed `vlens zoo train` arguments (also how a model card's
    commands are read back: tests/recipes/test_zoo_card_commands.py)."""
    from vlens.recipes.embedded.training_set import parse_mix

    return RecipeSettings(
        seed=args.seed,
        n_examples=args.examples,
        threads=args.threads,
        held_out_per_source=args.held_out,
        checkpoint_every=args.checkpoint_every,
        checkpoint_dir=args.checkpoint_dir,
        resume=args.resume,
        overwrite=args.overwrite,
        init_from=args.init_from,
        mix=parse_mix(args.mix) if args.mix else None,
        max_objects=args.max_objects,
        grow_vision_depth=args.grow_vision_depth,
        grow_text_layers=args.grow_text_layers,
        device=args.device,
        image_size=args.image_size,
        stage=args.stage,
        probe_scenes=args.probe_scenes,
        rope_theta=args.rope_theta,
        mrope_section=args.mrope_section,
        fresh_decoder=args.fresh_decoder,
        vision_from=args.vision_from,
        text_layers=args.text_layers,
        minimal_pairs=args.minimal_pairs,
        arithmetic_pairs=args.arithmetic_pairs,
        question_first=args.question_first,
        train=TrainSettings(
            steps=args.steps,
            stop_after=args.stop_after,
            batch_size=args.batch_size,
            learning_rate=args.lr,
            warmup_steps=args.warmup,
            log_every=args.log_every,
            vision_aux_weight=args.vision_aux_weight,
            freeze_vision=args.freeze_vision,
        ),
    )


def _train(args: argparse.Namespace) -> int:
    from vlens.recipes.embedded.loop import Interrupted
    from vlens.recipes.embedded.recipe import run_recipe

    settings = settings_from_args(args)
    if args.render_only:
        from vlens.recipes.embedded.recipe import render_only

        path = render_only(Path(args.out), settings, progress=not args.quiet)
        logger.info("training set rendered into %s; the stage's run reads it", path)
        return 0
    try:
        summary = run_recipe(Path(args.out), settings, progress=not args.quiet)
    except Interrupted as stop:
        logger.warning("%s", stop)  # how to resume: the state is saved
        return 130
    per_task = summary["evaluation"].get("per_task", {})
    echo(json.dumps({name: round(row["accuracy"], 4) for name, row in per_task.items()}))
    echo(json.dumps({"probe": summary["training"]["probe"]}))
    logger.info("model folder: %s (MODEL_CARD.md, training_log.jsonl)", args.out)
    return 0


def _evaluate(args: argparse.Namespace) -> int:
    import torch

    torch.set_num_threads(args.threads)
    if args.write and args.question_first:
        raise UserInputError(
            "--write records the image-first evaluation the model card reports; run --question-first "
            "without --write (it only prints)"
        )
    if args.write and args.split != "card":
        raise UserInputError(
            "--write records the card's held-out images; run --split selection without --write (it only prints)"
        )
    if args.write:
        from vlens.recipes.embedded.finalize import finalize_folder

        if not args.model:
            raise UserInputError("--write needs --model DIR (the shipped folder is not rewritten in place)")
        summary = finalize_folder(args.model, args.held_out)
        echo(json.dumps({name: row["accuracy"] for name, row in summary["evaluation"]["per_task"].items()}))
        return 0
    from transformers import Qwen2_5_VLForConditionalGeneration

    from vlens.core.loading import from_pretrained_checked
    from vlens.recipes.embedded.evaluate import evaluate_samples
    from vlens.recipes.embedded.training_set import held_out_samples
    from vlens.zoo import model_path
    from vlens.zoo.processor import load_processor
    from vlens.zoo.specs import hf_progress_bars

    folder = Path(args.model) if args.model else model_path()
    with hf_progress_bars(not args.quiet):
        model = from_pretrained_checked(Qwen2_5_VLForConditionalGeneration, str(folder)).eval()
    report = evaluate_samples(model, load_processor(folder), held_out_samples(args.held_out, split=args.split),
                              question_first=args.question_first)
    echo(json.dumps(report, indent=2))
    return 0


def configure(zoo: argparse.ArgumentParser) -> None:
    """`vlens zoo train` and `vlens zoo evaluate` (the dispatcher adds --quiet and -v)."""
    defaults, recipe = TrainSettings(), RecipeSettings()
    positive, non_negative = arg_int(min=1), arg_int(min=0)
    commands = zoo.add_subparsers(dest="zoo_command", metavar="ZOO_COMMAND", required=True)

    train = commands.add_parser("train", help="train one stage of the embedded model into a folder")
    train.add_argument(
        "--out",
        required=True,
        type=arg_path,
        metavar="DIR",
        help="output folder, created when missing: an HF model folder + MODEL_CARD.md + log, written "
        "whole at the end (an existing model folder only with --overwrite)",
    )
    train.add_argument(
        "--stage",
        choices=["vision", "language"],
        default="language",
        help="vision: pretrain the vision tower alone on dense cell labels; language: answer tokens",
    )
    train.add_argument(
        "--seed", type=non_negative, default=0, help="seed of data, initialisation and batches"
    )
    train.add_argument("--steps", type=positive, default=defaults.steps, help="steps of the schedule")
    train.add_argument(
        "--stop-after", type=positive, default=None, help="stop at this step (schedule spans --steps)"
    )
    train.add_argument(
        "--batch-size", type=positive, default=defaults.batch_size, metavar="N", help="examples per step"
    )
    train.add_argument(
        "--lr",
        type=arg_float(min=0, min_open=True),
        default=defaults.learning_rate,
        help="peak learning rate",
    )
    train.add_argument("--warmup", type=non_negative, default=defaults.warmup_steps, help="warm-up steps")
    train.add_argument(
        "--examples", type=positive, default=recipe.n_examples, help="pre-rendered training examples"
    )
    train.add_argument("--threads", type=positive, default=1, help="torch threads (results depend on it)")
    train.add_argument(
        "--held-out", type=positive, default=recipe.held_out_per_source, help="held-out samples per source"
    )
    train.add_argument("--log-every", type=positive, default=defaults.log_every, help="log every N steps")
    train.add_argument(
        "--checkpoint-every",
        type=positive,
        default=recipe.checkpoint_every,
        help="save the resumable state (and a snapshot with a quick evaluation) every N steps",
    )
    train.add_argument(
        "--checkpoint-dir",
        default=None,
        help="where the resumable state lives (default: OUT.checkpoint next to --out)",
    )
    train.add_argument("--resume", action="store_true", help="continue the saved state of this command's run")
    train.add_argument(
        "--render-only",
        action="store_true",
        help="render this stage's training set into its checkpoint folder and stop; the stage's run reads it. "
        "The image size is --image-size, else --init-from's, which may name any folder of that size (e.g. the "
        "stage before, while it still trains: render on a spare core)",
    )
    train.add_argument(
        "--overwrite",
        action="store_true",
        help="replace an existing model folder at --out (kept until the new one is complete) or discard a saved state",
    )
    train.add_argument(
        "--mix", default=None, help="source weights, e.g. colour=0.2,shape=0.2 (default: recipe mix)"
    )
    train.add_argument("--init-from", default=None, help="continue training a folder this command wrote")
    train.add_argument(
        "--max-objects",
        type=positive,
        default=None,
        help="curriculum stage: at most this many objects in colour/shape/spatial/arithmetic/existence "
        "images (spatial keeps >= 2, arithmetic >= 3; counting always 1-10)",
    )
    train.add_argument(
        "--grow-vision-depth",
        type=positive,
        default=None,
        help="with --init-from: first grow the vision tower to this many blocks (new ones start as identity)",
    )
    train.add_argument(
        "--grow-text-layers",
        type=positive,
        default=None,
        help="with --init-from: first grow the decoder to this many layers (new ones, interleaved, start "
        "as identity)",
    )
    train.add_argument(
        "--vision-aux-weight",
        type=arg_float(min=0),
        default=0.0,
        help="weight of the dense shape/colour/centre loss on the image tokens (0: answer tokens only)",
    )
    train.add_argument(
        "--freeze-vision",
        action="store_true",
        help="language stage with the vision tower and merger kept fixed",
    )
    train.add_argument(
        "--device",
        default="cpu",
        help="torch device to train on, e.g. cuda (CPU runs are bitwise reproducible)",
    )
    train.add_argument(
        "--image-size",
        type=_image_size,
        default=None,
        help="square input size in px, a multiple of 28 (default 224, or the --init-from folder's)",
    )
    train.add_argument(
        "--probe-scenes",
        type=arg_int(min=3),
        default=recipe.probe_scenes,
        help="held-out scenes for the linear probes of the tower after the stage (2/3 fit, 1/3 score)",
    )
    train.add_argument(
        "--rope-theta",
        type=arg_float(min=1, min_open=True),
        default=None,
        help="M-RoPE base of a decoder this stage builds (default 1e4; 30 lets both image axes turn, RESULTS.md)",
    )
    train.add_argument(
        "--mrope-section",
        type=_mrope_section,
        default=None,
        metavar="T,H,W",
        help="rotary frequencies per (time, height, width) axis of a decoder this stage builds, summing "
        "to d_head/2 (default 2,3,3)",
    )
    train.add_argument(
        "--fresh-decoder",
        action="store_true",
        help="with --init-from: keep its vision tower and merger and train a new decoder",
    )
    train.add_argument(
        "--vision-from",
        default=None,
        metavar="FOLDER",
        help="with --init-from (a language stage): replace its vision tower and merger by FOLDER's (a folder "
        "this command wrote with the same vision architecture, e.g. a tower pretrained further) and train on",
    )
    train.add_argument(
        "--text-layers",
        type=positive,
        default=None,
        help="depth of a decoder this stage builds (from scratch or --fresh-decoder; default 4)",
    )
    train.add_argument(
        "--minimal-pairs",
        action="store_true",
        help="binding questions (existence, spatial, colour, shape) also asked with another noun about the "
        "same image, both in one batch",
    )
    train.add_argument(
        "--arithmetic-pairs",
        action="store_true",
        help="with --minimal-pairs: each arithmetic question also asked with the other operation (sum <-> "
        "difference) about the same two colours, both in one batch",
    )
    train.add_argument(
        "--question-first",
        type=arg_float(min=0, max=1),
        default=recipe.question_first,
        metavar="P",
        help="probability in [0, 1] that a training sample puts its question before the image (drawn once "
        "per sample from its seed; a minimal pair keeps its sample's order; default 0: always after, so "
        "the image tokens never see the question)",
    )
    train.set_defaults(func=_train)

    evaluate = commands.add_parser("evaluate", help="held-out accuracy of a model folder (default: shipped)")
    evaluate.add_argument("--model", default=None, help="model folder (default: the shipped model)")
    evaluate.add_argument("--held-out", type=positive, default=100, help="held-out samples per source")
    evaluate.add_argument("--threads", type=positive, default=1, help="torch threads")
    evaluate.add_argument(
        "--write",
        action="store_true",
        help="update the folder's evaluation.json, log and MODEL_CARD.md (needs --model); the folder "
        "changes only after the evaluation succeeded",
    )
    evaluate.add_argument(
        "--question-first",
        action="store_true",
        help="ask each held-out question before its image (default: after it, as the card's evaluation); "
        "not with --write",
    )
    evaluate.add_argument(
        "--split",
        choices=["card", "selection"],
        default="card",
        help="card: the held-out images model cards report; selection: a second held-out range, for choosing "
        "between models without touching the card's images; not with --write",
    )
    evaluate.set_defaults(func=_evaluate)

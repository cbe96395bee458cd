"""`vlens zoo ...`: train (reproduce) and evaluate the embedded model.

Only the standard library is imported at top level (the dispatcher builds this parser for
`vlens zoo ... --help`); the recipe is imported when a command runs.
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

from vlens.errors import UserInputError

logger = logging.getLogger(__name__)

# TrainSettings fields that a flag left unset keeps at the recipe's default
_TRAIN_FLAGS = {"steps": "steps", "batch_size": "batch_size", "lr": "learning_rate", "warmup": "warmup_steps",
                "log_every": "log_every"}


def _train(args: argparse.Namespace) -> int:
    from vlens.recipes.embedded.recipe import RecipeSettings, run_recipe
    from vlens.recipes.embedded.train import TrainSettings
    from vlens.recipes.embedded.training_set import parse_mix

    settings = RecipeSettings(
        seed=args.seed,
        n_examples=args.examples,
        threads=args.threads,
        held_out_per_source=args.held_out,
        checkpoint_every=args.checkpoint_every,
        init_from=args.init_from,
        mix=parse_mix(args.mix) if args.mix else None,
        max_objects=args.max_objects,
        grow_vision_depth=args.grow_vision_depth,
        device=args.device,
        image_size=args.image_size,
        train=TrainSettings(
            stop_after=args.stop_after,
            vision_aux_weight=args.vision_aux_weight,
            **{field: getattr(args, flag) for flag, field in _TRAIN_FLAGS.items() if getattr(args, flag) is not None},
        ),
    )
    summary = run_recipe(Path(args.out), settings, progress=not args.quiet)
    print(
        json.dumps(
            {name: round(row["accuracy"], 4) for name, row in summary["evaluation"]["per_task"].items()}
        )
    )
    logger.info("model folder: %s (MODEL_CARD.md, training_log.jsonl)", args.out)
    return 0


def _evaluate(args: argparse.Namespace) -> int:
    import torch

    if args.write:
        from vlens.recipes.embedded.finalize import finalize_folder

        if not args.model:
            raise UserInputError("--write needs --model DIR (the shipped folder is not rewritten in place)")
        torch.set_num_threads(args.threads)
        summary = finalize_folder(args.model, args.held_out)
        print(json.dumps({name: row["accuracy"] for name, row in summary["evaluation"]["per_task"].items()}))
        return 0
    from transformers import Qwen2_5_VLForConditionalGeneration

    from vlens.recipes.embedded.evaluate import evaluate_samples
    from vlens.recipes.embedded.training_set import held_out_samples
    from vlens.specs import hf_progress_bars
    from vlens.zoo import model_path
    from vlens.zoo.processor import load_processor

    torch.set_num_threads(args.threads)
    folder = Path(args.model) if args.model else model_path()
    with hf_progress_bars(not args.quiet):
        model = Qwen2_5_VLForConditionalGeneration.from_pretrained(folder).eval()
    report = evaluate_samples(model, load_processor(folder), held_out_samples(args.held_out))
    print(json.dumps(report, indent=2))
    return 0


def configure(zoo: argparse.ArgumentParser) -> None:
    """`vlens zoo train` and `vlens zoo evaluate` (the dispatcher adds --quiet and -v)."""
    commands = zoo.add_subparsers(dest="zoo_command", metavar="ZOO_COMMAND", required=True)

    train = commands.add_parser("train", help="train the embedded model from scratch into a folder")
    train.add_argument("--out", required=True, metavar="DIR",
                       help="output folder, created when missing: an HF model folder + MODEL_CARD.md + log")
    train.add_argument("--seed", type=int, default=0, help="seed of data, initialisation and batches")
    train.add_argument("--steps", type=int, default=None, help="schedule length (default: the recipe's)")
    train.add_argument(
        "--stop-after", type=int, default=None, help="stop at this step (schedule spans --steps)"
    )
    train.add_argument("--batch-size", type=int, default=None, metavar="N",
                       help="examples per step (default: the recipe's)")
    train.add_argument("--lr", type=float, default=None, help="peak learning rate (default: the recipe's)")
    train.add_argument("--warmup", type=int, default=None, help="warm-up steps (default: the recipe's)")
    train.add_argument("--examples", type=int, default=30_000, help="pre-rendered training examples")
    train.add_argument("--threads", type=int, default=1, help="torch threads (results depend on it)")
    train.add_argument("--held-out", type=int, default=300, help="held-out samples per source")
    train.add_argument("--log-every", type=int, default=None, help="log every N steps (default: the recipe's)")
    train.add_argument("--checkpoint-every", type=int, default=0, help="refresh the folder every N steps")
    train.add_argument(
        "--mix", default=None, help="source weights, e.g. colour=0.2,shape=0.2 (default: recipe mix)"
    )
    train.add_argument("--init-from", default=None, help="continue training a folder this command wrote")
    train.add_argument(
        "--max-objects",
        type=int,
        default=None,
        help="curriculum stage: at most this many objects in colour/shape/spatial/arithmetic/existence "
        "images (spatial keeps >= 2, arithmetic >= 3; counting always 1-10)",
    )
    train.add_argument(
        "--grow-vision-depth",
        type=int,
        default=None,
        help="with --init-from: first grow the vision tower to this many blocks (new ones start as identity)",
    )
    train.add_argument(
        "--vision-aux-weight",
        type=float,
        default=0.0,
        help="weight of the dense shape/colour loss on the vision tower's image tokens (0: answer tokens only)",
    )
    train.add_argument(
        "--device",
        default="cpu",
        help="torch device to train on, e.g. cuda (CPU runs are bitwise reproducible)",
    )
    train.add_argument(
        "--image-size",
        type=int,
        default=None,
        help="square input size in px, a multiple of 28 (default 168, or the --init-from folder's)",
    )
    train.set_defaults(func=_train)

    evaluate = commands.add_parser("evaluate", help="held-out accuracy of a model folder (default: shipped)")
    evaluate.add_argument("--model", default=None, help="model folder (default: the shipped model)")
    evaluate.add_argument("--held-out", type=int, default=100, help="held-out samples per source")
    evaluate.add_argument("--threads", type=int, default=1)
    evaluate.add_argument(
        "--write",
        action="store_true",
        help="update the folder's evaluation.json, log and MODEL_CARD.md (needs --model)",
    )
    evaluate.set_defaults(func=_evaluate)

"""`vlens train`: LoRA SFT with or without L_focus (the interventions study is `vlens study`,
`vlens.cli.study`).

    vlens data syndot --n 4000 --out data/syndot
    vlens train --model tiny --data data/syndot data/synpoly --out runs/sft_focus
    vlens train --model tiny --data data/syndot --no-focus --out runs/sft --merged
"""

from __future__ import annotations

import argparse
import json
import logging

from vlens.cli.console import echo
from vlens.cli.dataset_options import add_data_arguments, load_data_arg
from vlens.cli.options import (
    add_batch_size,
    add_model_options,
    checked_by,
    load_model_from_args,
)
from vlens.utils.validation import arg_float, arg_int, arg_path

logger = logging.getLogger(__name__)

# training keeps float32 master weights; --bf16 decides the autocast
TRAIN_DTYPE = "float32"


def configure_train(train: argparse.ArgumentParser) -> None:
    """`vlens train`."""
    train.description = ("LoRA fine-tuning: L = answer-only cross-entropy + lambda * L_focus, the object-focused "
                         "attention loss (see docs/ in the repository). A run in --out resumes from its last "
                         "checkpoint.")
    add_model_options(train, dtype_default=TRAIN_DTYPE)
    add_data_arguments(train, multiple=True, required=True,
                       help="one or more datasets (imagefolders written by `vlens data`, PixMo-Count, "
                       "CountBenchQA, multiple choice, qa rows; see --format)")
    train.add_argument("--limit", type=arg_int(min=1), help="use only the first N examples of each folder")
    train.add_argument("--out", required=True, type=arg_path, metavar="DIR",
                       help="output folder, created when missing: the run (adapter/, checkpoints, "
                            "sft_result.json, merged/ with --merged); a run already there is resumed")
    train.add_argument("--focus-weight", type=arg_float(min=0), default=1.0, help="lambda (default 1.0)")
    train.add_argument("--no-focus", action="store_true", help="plain LoRA SFT (lambda = 0)")
    train.add_argument(
        "--focus-layers", type=checked_by(_focus_layers), help="comma-separated layers (default: the paper's, mapped to the depth)"
    )
    train.add_argument("--focus-query", choices=["final", "answer"], default="final",
                       help="whose attention the focus loss shapes: the final prompt position or the answer tokens")
    train.add_argument("--sigma", type=arg_float(min=0, min_open=True), default=1.0,
                       help="prior width in grid units (default 1)")
    train.add_argument("--lora-rank", type=arg_int(min=1), default=64, help="LoRA rank")
    train.add_argument("--lr", type=arg_float(min=0, min_open=True), default=2e-5, help="learning rate")
    train.add_argument("--epochs", type=arg_int(min=1), default=2, help="passes over the training set")
    add_batch_size(train, 2, "examples per micro-batch")
    train.add_argument("--grad-accum", type=arg_int(min=1), default=1,
                       help="micro-batches whose gradients are summed per optimizer step")
    train.add_argument("--max-steps", type=arg_int(min=1), help="stop after N optimizer steps")
    train.add_argument("--checkpoint-every", type=arg_int(min=1), default=50,
                       help="optimizer steps between checkpoints in --out (a run there is resumed from the last)")
    train.add_argument("--bf16", choices=["auto", "on", "off"], default="auto",
                       help="bf16 autocast (default auto: on CUDA GPUs with bf16)")
    train.add_argument("--gradient-checkpointing", choices=["auto", "on", "off"], default="auto",
                       help="recompute decoder blocks in the backward to save memory (auto: on for d_model >= 1024, "
                       "i.e. every 7-8B model)")
    train.add_argument("--seed", type=arg_int(min=0), default=0, help="seed of the initialisation and shuffling")
    train.add_argument("--no-resume", action="store_true",
                       help="start over; checkpoints already in --out are moved to OUT/checkpoints.previous-N")
    train.add_argument("--force-resume", action="store_true",
                       help="resume even if --out's checkpoint was written with other data or settings")
    train.add_argument(
        "--merged", action="store_true", help="also write a merged HF checkpoint to OUT/merged"
    )
    train.set_defaults(func=run_train)


def _focus_layers(text: str | None) -> list[int] | None:
    from vlens.utils.errors import UserInputError

    if not text:
        return None
    try:
        return [int(x) for x in text.split(",")]
    except ValueError:
        raise UserInputError(f"--focus-layers {text!r}: give comma-separated layer numbers, e.g. 1,2") from None


def _switch(choice: str) -> str | bool:
    """auto|on|off -> "auto" | True | False (SFTConfig's spelling)."""
    return "auto" if choice == "auto" else choice == "on"


def run_train(args: argparse.Namespace) -> int:
    from vlens.training.data import examples_from_dataset
    from vlens.training.export import save_merged
    from vlens.training.sft import SFTConfig, train_sft
    from vlens.utils.validation import check_output_folder

    check_output_folder(args.out, "--out")  # a run folder: resumed, so results are never refused here
    examples = [example for path in args.data for example in examples_from_dataset(load_data_arg(args, path, args.limit),
                                                                                      args.limit)]
    config = SFTConfig(
        lora_rank=args.lora_rank,
        focus_weight=0.0 if args.no_focus else args.focus_weight,
        focus_layers=_focus_layers(args.focus_layers),
        focus_sigma=args.sigma,
        focus_query=args.focus_query,
        learning_rate=args.lr,
        batch_size=args.batch_size,
        grad_accum=args.grad_accum,
        epochs=args.epochs,
        max_steps=args.max_steps,
        checkpoint_every=args.checkpoint_every,
        bf16=_switch(args.bf16),
        gradient_checkpointing=_switch(args.gradient_checkpointing),
        seed=args.seed,
    )
    config.check()  # before the model loads
    model = load_model_from_args(args)
    result = train_sft(model, examples, config, args.out, resume=not args.no_resume, progress=not args.quiet,
                       force_resume=args.force_resume)
    echo(json.dumps({k: v for k, v in result.to_dict().items() if k != "config"}, indent=1))
    if args.merged and result.steps == result.total_steps:
        logger.info("merged checkpoint: %s", save_merged(model, args.out / "merged", overwrite=True))
    return 0

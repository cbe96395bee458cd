"""`vlens train` (LoRA SFT with or without L_focus), `vlens study` (the ablation table) and,
through `vlens.interventions.cli`, `vlens temperature`.

    vlens data counting --style syndot --n 4000 --out data/syndot     # (vlens data)
    vlens train --model tiny --data data/syndot data/synpoly --out runs/sft_focus
    vlens train --model tiny --data data/syndot --no-focus --out runs/sft --merged
    vlens study --model tiny --out runs/study --seeds 0 --model-card vlens/zoo/weights/.../MODEL_CARD.md
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from vlens.validation import arg_float, arg_int, check_output_folder


def add_cli(subparsers) -> None:
    from vlens.interventions.cli import add_cli as add_temperature_cli

    train = subparsers.add_parser(
        "train",
        help="LoRA fine-tuning with the object-focused attention loss",
        description="L = answer-only cross-entropy + lambda * L_focus (PAPER.md).",
    )
    train.add_argument("--model", default="tiny", help="'tiny', 'random-tiny' or a path / hub id")
    train.add_argument(
        "--data", required=True, nargs="+", type=Path, help="imagefolders written by `vlens data`"
    )
    train.add_argument("--limit", type=arg_int(min=1), help="use only the first N examples of each folder")
    train.add_argument("--out", required=True, type=Path)
    train.add_argument("--focus-weight", type=arg_float(min=0), default=1.0, help="lambda (default 1.0)")
    train.add_argument("--no-focus", action="store_true", help="plain LoRA SFT (lambda = 0)")
    train.add_argument(
        "--focus-layers", help="comma-separated layers (default: the paper's, mapped to the depth)"
    )
    train.add_argument("--focus-query", choices=["final", "answer"], default="final")
    train.add_argument("--sigma", type=arg_float(min=0, min_open=True), default=1.0, help="prior width in grid units (default 1)")
    train.add_argument("--lora-rank", type=arg_int(min=1), default=64)
    train.add_argument("--lr", type=arg_float(min=0, min_open=True), default=2e-5)
    train.add_argument("--epochs", type=arg_int(min=1), default=2)
    train.add_argument("--batch-size", type=arg_int(min=1), default=2)
    train.add_argument("--grad-accum", type=arg_int(min=1), default=1)
    train.add_argument("--max-steps", type=arg_int(min=1), help="stop after N optimizer steps")
    train.add_argument("--checkpoint-every", type=arg_int(min=1), default=50)
    train.add_argument("--bf16", choices=["auto", "on", "off"], default="auto")
    train.add_argument("--seed", type=int, default=0)
    train.add_argument("--no-resume", action="store_true",
                       help="start over; checkpoints already in --out are moved to OUT/checkpoints.previous-N")
    train.add_argument("--force-resume", action="store_true",
                       help="resume even if --out's checkpoint was written with other data or settings")
    train.add_argument(
        "--merged", action="store_true", help="also write a merged HF checkpoint to OUT/merged"
    )
    train.add_argument("--quiet", action="store_true", help="no progress bar")
    train.set_defaults(func=run_train)

    study = subparsers.add_parser(
        "study",
        help="baseline / +SFT / +SFT+L_focus / +SFT+L_focus+beta table",
        description="Reproduce PAPER.md's ablation table at toy scale (see "
        "vlens.training.study for the scaled-down settings).",
    )
    study.add_argument("--model", default="tiny")
    study.add_argument("--out", required=True, type=Path)
    study.add_argument("--seeds", type=arg_int(min=0), nargs="+", default=[0])
    study.add_argument(
        "--n-train", type=arg_int(min=1), default=200, help="fine-tuning images per style (SynDot, SynPoly)"
    )
    study.add_argument("--n-eval", type=arg_int(min=1), default=100, help="evaluation examples per set")
    study.add_argument("--epochs", type=arg_int(min=1), default=1)
    study.add_argument("--lr", type=arg_float(min=0, min_open=True), default=1e-3)
    study.add_argument("--lora-rank", type=arg_int(min=1), default=64)
    study.add_argument("--top-k-heads", type=arg_int(min=1), default=4)
    study.add_argument("--alpha", type=arg_float(min=0, min_open=True), default=1.2)
    study.add_argument("--model-card", type=Path, help="also put the results table into this model card")
    study.add_argument("--quiet", action="store_true")
    study.set_defaults(func=run_study_cli)

    add_temperature_cli(subparsers)


def run_train(args: argparse.Namespace) -> int:
    from vlens.info_cli import load_model_arg
    from vlens.training.data import read_sft_folder
    from vlens.training.export import save_merged
    from vlens.training.sft import SFTConfig, train_sft

    check_output_folder(args.out, "--out")
    examples = [example for folder in args.data for example in read_sft_folder(folder, args.limit)]
    layers = [int(x) for x in args.focus_layers.split(",")] if args.focus_layers else None
    config = SFTConfig(
        lora_rank=args.lora_rank,
        focus_weight=0.0 if args.no_focus else args.focus_weight,
        focus_layers=layers,
        focus_sigma=args.sigma,
        focus_query=args.focus_query,
        learning_rate=args.lr,
        batch_size=args.batch_size,
        grad_accum=args.grad_accum,
        epochs=args.epochs,
        max_steps=args.max_steps,
        checkpoint_every=args.checkpoint_every,
        bf16={"auto": "auto", "on": True, "off": False}[args.bf16],
        seed=args.seed,
    )
    config.check()  # before the model loads
    model = load_model_arg(args.model)
    result = train_sft(model, examples, config, args.out, resume=not args.no_resume, progress=not args.quiet,
                       force_resume=args.force_resume)
    print(json.dumps({k: v for k, v in result.to_json().items() if k != "config"}, indent=1))
    if args.merged and result.steps == result.total_steps:
        print(f"merged checkpoint: {save_merged(model, args.out / 'merged', overwrite=True)}")
    return 0


def run_study_cli(args: argparse.Namespace) -> int:
    from vlens.info_cli import load_model_arg
    from vlens.training.study import StudySettings, run_study, write_model_card_section

    settings = StudySettings(
        seeds=args.seeds,
        n_train_per_style=args.n_train,
        n_eval=args.n_eval,
        epochs=args.epochs,
        learning_rate=args.lr,
        lora_rank=args.lora_rank,
        top_k_heads=args.top_k_heads,
        alpha=args.alpha,
    )
    name = "vlens.load() (the embedded tiny Qwen2.5-VL)" if args.model == "tiny" else args.model
    result = run_study(
        lambda: load_model_arg(args.model), settings, args.out, progress=not args.quiet, model_name=name
    )
    print(result.report())
    if args.model_card:
        print(f"model card: {write_model_card_section(result, args.model_card)}")
    return 0

"""`vlens study`: the interventions table (`vlens.studies.interventions`), a thin command.

    vlens study --model tiny --out runs/study --seeds 0 --model-card vlens/zoo/weights/.../MODEL_CARD.md

Writes ``study.json``, ``STUDY.md`` and each run's adapters into ``--out``.
"""

from __future__ import annotations

import argparse
import logging

from vlens.cli.console import echo
from vlens.cli.options import add_model_options, add_out, model_options, prepare_out
from vlens.utils.validation import arg_float, arg_int, arg_path, check_count, check_output_file

logger = logging.getLogger(__name__)

# training keeps float32 master weights
TRAIN_DTYPE = "float32"
STUDY_JSON, STUDY_MD = "study.json", "STUDY.md"


def configure(study: argparse.ArgumentParser) -> None:
    """`vlens study`."""
    study.description = ("The interventions table at toy scale: baseline / +SFT / +SFT+L_focus / "
                         "+SFT+L_focus+beta (see vlens.studies.interventions for the scaled-down settings).")
    add_model_options(study, dtype_default=TRAIN_DTYPE)
    add_out(study, f"{STUDY_JSON}, {STUDY_MD} and each run's adapters")
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
    study.add_argument("--model-card", type=arg_path, help="also put the results table into this model card")
    study.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from vlens.studies.interventions import StudySettings, run_study, write_model_card_section
    from vlens.zoo.specs import load_model

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
    prepare_out(args, STUDY_JSON, STUDY_MD)
    if args.model_card:  # now, not after the whole study
        check_output_file(args.model_card, "--model-card")
    name = "vlens.load() (the embedded tiny Qwen2.5-VL)" if args.model == "tiny" else args.model
    options = model_options(args)

    def load():
        model = load_model(args.model, **options)
        check_count(args.top_k_heads, "--top-k-heads", max=model.cfg.n_heads_total)  # the flag's name
        return model

    result = run_study(load, settings, args.out, progress=not args.quiet, model_name=name)
    echo(result.report())
    if args.model_card:
        logger.info("model card: %s", write_model_card_section(result, args.model_card))
    return 0

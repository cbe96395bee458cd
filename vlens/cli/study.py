"""`vlens study`: the studies as thin commands.

    vlens study --model tiny --out runs/study --seeds 0 --model-card vlens/zoo/weights/.../MODEL_CARD.md
    vlens study object-tokens --model tiny --task name colour --n 64 --out runs/object-tokens
    vlens study flow --model tiny --task colour name --n 64 --window 1 --out runs/flow

The first (the default study, "interventions": `vlens.studies.interventions`) writes ``study.json``,
``STUDY.md`` and each run's adapters into ``--out``; "object-tokens" (`vlens.studies.object_tokens`) and
"flow" (`vlens.studies.flow`) write ``results.json``, ``STUDY.md`` and their figure. A flag of one study
given to another is refused.
"""

from __future__ import annotations

import argparse
import logging

from vlens.cli.console import echo
from vlens.cli.options import (
    RESULTS_FILE,
    add_batch_size,
    add_model_options,
    add_out,
    load_model_from_args,
    model_options,
    prepare_out,
    rendered_size,
    write_figure,
)
from vlens.utils.errors import UserInputError
from vlens.utils.results import Result
from vlens.utils.validation import arg_float, arg_int, arg_path, check_count, check_output_file
from vlens.zoo.image_sizes import OBJECT_IMAGE_SIZE

logger = logging.getLogger(__name__)

# training keeps float32 master weights
TRAIN_DTYPE = "float32"
STUDY_JSON, STUDY_MD = "study.json", "STUDY.md"
STUDIES = ("interventions", "object-tokens", "flow")
FIGURES = {"object-tokens": "object_tokens.html", "flow": "flow.html"}
# the names of vlens.flow.batch.TASK_NAMES (a test keeps them equal)
OBJECT_TASK_NAMES = ("name", "colour_at", "colour", "shape")
# which study each flag belongs to (flags of the model, --out and output are everyone's)
OWNERS = {
    "seeds": ("interventions",), "n_train": ("interventions",), "n_eval": ("interventions",),
    "epochs": ("interventions",), "lr": ("interventions",), "lora_rank": ("interventions",),
    "top_k_heads": ("interventions",), "alpha": ("interventions",), "model_card": ("interventions",),
    "task": ("object-tokens", "flow"), "n": ("object-tokens", "flow"), "batch_size": ("object-tokens", "flow"),
    "seed": ("object-tokens", "flow"), "how": ("object-tokens",), "at": ("object-tokens",),
    "buffer": ("object-tokens",), "window": ("flow",),
}


def site_arg(text: str) -> str:
    """--at: vision, middle or a decoder layer number (what ObjectTokenSettings.sites takes)."""
    if text not in ("vision", "middle") and not text.isdigit():
        raise argparse.ArgumentTypeError(f"site {text!r}: use vision, middle or a decoder layer number")
    return text


def configure(study: argparse.ArgumentParser) -> None:
    """`vlens study`."""
    study.description = ("A study: interventions (default; the table baseline / +SFT / +SFT+L_focus / "
                         "+SFT+L_focus+beta at toy scale, see vlens.studies.interventions), object-tokens (object-token "
                         "ablation vs random and high-norm tokens), flow (attention knockout over layer windows).")
    study.add_argument("study", nargs="?", choices=STUDIES, default="interventions",
                       help=f"which study: {', '.join(STUDIES)} (default interventions)")
    add_model_options(study, dtype_default=TRAIN_DTYPE)
    add_out(study, f"interventions: {STUDY_JSON}, {STUDY_MD} and each run's adapters; object-tokens / flow: "
            f"{RESULTS_FILE}, {STUDY_MD} and the figure")
    mine = study.add_argument_group("object-tokens and flow", f"images drawn at --image-size, else at the square "
                                    f"size the model's processor pins, else {OBJECT_IMAGE_SIZE} px")
    mine.add_argument("--task", nargs="+", choices=OBJECT_TASK_NAMES, default=None,
                      help="object tasks (default: object-tokens name colour; flow colour name)")
    mine.add_argument("--n", type=arg_int(min=1), default=64, help="examples per task (default 64)")
    mine.add_argument("--seed", type=arg_int(min=0), default=0, help="examples' and baselines' seed (default 0)")
    add_batch_size(study, 16)
    mine.add_argument("--how", choices=("mean", "zero", "resample"), default="mean",
                      help="object-tokens: the ablation (default mean)")
    mine.add_argument("--at", nargs="+", type=site_arg, default=["vision", "middle"], metavar="SITE",
                      help="object-tokens: vision, middle (layer n_layers // 2) or a layer number (default vision middle)")
    mine.add_argument("--buffer", type=arg_int(min=0), default=1, help="object-tokens: grid cells around the object "
                      "ablated with it (default 1)")
    mine.add_argument("--window", type=arg_int(min=1), default=None, metavar="K",
                      help="flow: layers per window (default max(1, n_layers // 4))")
    study.add_argument("--seeds", type=arg_int(min=0), nargs="+", default=[0],
                       help="one fine-tuning run per seed (results are reported across them)")
    study.add_argument(
        "--n-train", type=arg_int(min=1), default=200, help="fine-tuning images per style (SynDot, SynPoly)"
    )
    study.add_argument("--n-eval", type=arg_int(min=1), default=100, help="evaluation examples per set")
    study.add_argument("--epochs", type=arg_int(min=1), default=1, help="fine-tuning epochs")
    study.add_argument("--lr", type=arg_float(min=0, min_open=True), default=1e-3, help="fine-tuning learning rate")
    study.add_argument("--lora-rank", type=arg_int(min=1), default=64, help="LoRA rank of the fine-tuning")
    study.add_argument("--top-k-heads", type=arg_int(min=1), default=4,
                       help="heads given a temperature (the top ones by ablation damage)")
    study.add_argument("--alpha", type=arg_float(min=0, min_open=True), default=1.2,
                       help="temperature scale: beta = alpha * gamma (as temperature fit --alpha)")
    study.add_argument("--model-card", type=arg_path, help="also put the results table into this model card")
    study.set_defaults(func=run)


def check_flags(args: argparse.Namespace, parser_defaults: dict) -> None:
    """Refuse a flag that belongs to another study than the one chosen (given with a non-default value)."""
    foreign = [name for name, owners in OWNERS.items()
               if args.study not in owners and getattr(args, name, None) != parser_defaults.get(name)]
    if foreign:
        flags = ", ".join("--" + name.replace("_", "-") for name in foreign)
        raise UserInputError(f"{flags} do not apply to `vlens study {args.study}` (they belong to "
                             f"{' / '.join(OWNERS[foreign[0]])}); leave them out")


DEFAULTS = {"seeds": [0], "n_train": 200, "n_eval": 100, "epochs": 1, "lr": 1e-3, "lora_rank": 64, "top_k_heads": 4,
            "alpha": 1.2, "model_card": None, "task": None, "n": 64, "batch_size": 16, "seed": 0, "how": "mean",
            "at": ["vision", "middle"], "buffer": 1, "window": None}


def run(args: argparse.Namespace) -> int:
    check_flags(args, DEFAULTS)
    if args.study != "interventions":
        return run_flow_study(args)
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


def run_flow_study(args: argparse.Namespace) -> int:
    """`vlens study object-tokens` / `vlens study flow`."""
    out = prepare_out(args, RESULTS_FILE, STUDY_MD, FIGURES[args.study])
    size = rendered_size(args, fallback=OBJECT_IMAGE_SIZE)
    name = "vlens.load() (the embedded tiny Qwen2.5-VL)" if args.model == "tiny" else args.model
    result: Result
    if args.study == "object-tokens":
        from vlens.studies.object_tokens import ObjectTokenSettings, run_object_token_study

        settings = ObjectTokenSettings(tasks=tuple(args.task or ("name", "colour")), n=args.n, sites=tuple(args.at),
                                       how=args.how, buffer=args.buffer, size=size, batch_size=args.batch_size,
                                       seed=args.seed)
        model = load_model_from_args(args)
        result = run_object_token_study(model, settings, model_name=name, progress=not args.quiet)
    else:
        from vlens.studies.flow import FlowSettings
        from vlens.studies.flow import run_flow_study as run_flow

        flow = FlowSettings(tasks=tuple(args.task or ("colour", "name")), n=args.n, window=args.window, size=size,
                            batch_size=args.batch_size, seed=args.seed)
        model = load_model_from_args(args)
        result = run_flow(model, flow, model_name=name, progress=not args.quiet)
    result.save(out)
    (out / STUDY_MD).write_text(result.report() + "\n", encoding="utf-8")
    write_figure(result.plot, out / FIGURES[args.study])
    echo(result.report())
    return 0

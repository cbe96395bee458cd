"""`vlens transcoder train` and `vlens transcoder evaluate`: transcoders replacing a model's MLPs.

    vlens transcoder train --model tiny --make 400 --kind clt --activation relu --d-tc 256 \\
        --tokens 200000 --evaluate 32 --out runs/tc
    vlens transcoder evaluate --model tiny --transcoders runs/tc --make 64 --out runs/tc_eval

`train` streams (MLP input, MLP output) pairs of every layer (or --layers) at image and text
positions and writes vlens's transcoder folder (transcoder_config.json + transcoder_weights.safetensors;
--saelens also writes SAELens folders layer_<l>/ for per-layer ReLU / skip / JumpReLU sets) and
results.json (settings, log, metrics; with --evaluate N the evaluation). `evaluate` reads a vlens,
SAELens or circuit-tracer (.yaml) set and measures explained variance, L0, dead features and the loss
/ KL recovered with every covered MLP replaced.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from vlens.cli.console import echo
from vlens.cli.dataset_options import mark_input_paths
from vlens.cli.options import (
    RESULTS_FILE,
    add_out,
    checked_by,
    load_model_from_args,
    prepare_out,
    write_results,
)
from vlens.cli.recorded_model import choose_model, recorded_spec
from vlens.cli.sae import HELD_OUT_SEED, REGIONS, add_sample_options, samples
from vlens.utils.errors import UserInputError
from vlens.utils.validation import arg_float, arg_int, arg_path


def parse_layers(text: str | None) -> list[int] | None:
    if text is None:
        return None
    try:
        return [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise UserInputError(f"--layers {text!r}: write comma-separated layer indices, e.g. 0,1,2") from None


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = "Transcoders replacing a model's MLPs (docs/transcoders.md in the repository)."
    commands = parser.add_subparsers(dest="transcoder_command", metavar="SUBCOMMAND", required=True)

    train = commands.add_parser("train", help="train transcoders on (MLP input, MLP output) pairs",
                                description="Train per-layer, skip or cross-layer transcoders on every layer's "
                                            "(MLP input, MLP output) pairs at image and text positions.")
    add_sample_options(train)
    train.add_argument("--layers", type=checked_by(parse_layers), help="comma-separated decoder layers (default: every layer)")
    train.add_argument("--positions", choices=REGIONS, default="all", help="token positions (default all)")
    train.add_argument("--kind", choices=("plt", "skip", "clt"), default="plt",
                       help="per-layer, per-layer with a skip connection, or cross-layer (default plt)")
    train.add_argument("--activation", choices=("relu", "topk", "jumprelu"), default="relu",
                       help="relu with an L1 penalty, topk (the k largest), or jumprelu with an L0 penalty")
    train.add_argument("--d-tc", type=arg_int(min=1), default=256, help="features per layer (default 256)")
    train.add_argument("--k", type=arg_int(min=1), default=16, help="topk: active features per token (default 16)")
    train.add_argument("--l1", type=arg_float(min=0), default=1e-3, help="relu: L1 coefficient (default 1e-3)")
    train.add_argument("--l0", type=arg_float(min=0), default=1e-3, help="jumprelu: L0 coefficient (default 1e-3)")
    train.add_argument("--lr", type=arg_float(min=0, min_open=True), default=1e-3, help="Adam learning rate")
    train.add_argument("--warmup-steps", type=arg_int(min=0), default=20, help="steps of linear learning-rate warm-up")
    train.add_argument("--tokens", type=arg_int(min=1), default=100_000, help="pairs to train on (default 1e5)")
    train.add_argument("--batch-tokens", type=arg_int(min=1), default=256, help="pairs per step (default 256)")
    train.add_argument("--buffer", type=arg_int(min=2), default=4096, help="shuffling buffer size (default 4096)")
    train.add_argument("--cache-dir", type=arg_path, help="keep the pairs on disk here (reused)")
    train.add_argument("--checkpoint-every", type=arg_int(min=0), default=0, help="steps between checkpoints")
    train.add_argument("--checkpoint-dir", type=arg_path,
                       help="full training state (default OUT.checkpoint; also written when Ctrl-C or an error stops the run)")
    train.add_argument("--resume", action="store_true", help="continue the run in --checkpoint-dir")
    train.add_argument("--stop-after", type=arg_int(min=1), help="end after N steps (continue with --resume)")
    train.add_argument("--saelens", action="store_true", help="also write SAELens folders layer_<l>/ (per-layer sets)")
    train.add_argument("--evaluate", type=arg_int(min=1), metavar="N",
                       help="then evaluate on N held-out generated samples (loss / KL recovered, per-layer metrics)")
    add_out(train, f"the transcoder folder and {RESULTS_FILE}")
    train.set_defaults(func=run_train)

    evaluate = commands.add_parser("evaluate", help="explained variance, L0, dead features, loss / KL recovered",
                                   description="Replace every covered MLP by its transcoder and measure what is "
                                               "lost (vlens, SAELens or circuit-tracer transcoders).")
    add_sample_options(evaluate, recorded_by="the transcoder folder")
    source = evaluate.add_argument("--transcoders", required=True, type=arg_path,
                                   help="a vlens or SAELens transcoder folder, or a circuit-tracer .yaml")
    mark_input_paths(evaluate, source.dest)
    add_out(evaluate, f"{RESULTS_FILE} (per layer and overall)")
    evaluate.set_defaults(func=run_evaluate)


def report(evaluation) -> None:
    recovered = "n/a" if evaluation.loss_recovered is None else f"{evaluation.loss_recovered:.3f}"
    kl = "n/a" if evaluation.kl_recovered is None else f"{evaluation.kl_recovered:.3f}"
    echo(f"every covered MLP replaced: loss recovered {recovered} (clean {evaluation.loss_clean:.4f}, transcoders "
         f"{evaluation.loss_transcoders:.4f}, zeroed {evaluation.loss_zero:.4f}), KL recovered {kl}")
    for row in evaluation.layers:
        echo(f"  layer {row['layer']}: explained variance {row['explained_variance']:.3f}, L0 {row['l0']:.1f}, "
             f"dead {row['dead_fraction']:.3f}")


def run_train(args: argparse.Namespace) -> int:
    if args.buffer < 2 * args.batch_tokens:
        raise UserInputError(f"--buffer ({args.buffer}) must be at least twice --batch-tokens ({args.batch_tokens})")
    # the state is saved there also when Ctrl-C or an error stops the run, so --resume continues it
    checkpointing = bool(args.checkpoint_dir or args.checkpoint_every or args.resume or args.stop_after)
    checkpoint_dir = args.checkpoint_dir or Path(str(args.out).rstrip("/") + ".checkpoint")
    out = prepare_out(args, RESULTS_FILE, "transcoder_config.json")

    from vlens.sae.settings import TrainRun
    from vlens.transcoders import (
        PairSource,
        TranscoderTraining,
        evaluate_transcoders,
        save_saelens_transcoders,
        train_transcoders,
    )

    training = TranscoderTraining(kind=args.kind, activation=args.activation, d_tc=args.d_tc, k=args.k,
                                  l1_coefficient=args.l1, l0_coefficient=args.l0, lr=args.lr,
                                  warmup_steps=args.warmup_steps, total_tokens=args.tokens,
                                  batch_size=args.batch_tokens, buffer_size=args.buffer, seed=args.seed)
    run = TrainRun(checkpoint_dir=checkpoint_dir, checkpoint_every=args.checkpoint_every, resume=args.resume,
                   stop_after=args.stop_after, final_checkpoint=checkpointing, progress=not args.quiet)
    model = load_model_from_args(args)
    source = PairSource(model, samples(args), layers=parse_layers(args.layers), positions=args.positions,
                        prompts_per_chunk=args.prompts_per_forward, cache_dir=args.cache_dir)
    result = train_transcoders(source, training, run)
    result.transcoders.cfg.metadata.update(model_name=recorded_spec(args.model), positions=args.positions,
                                           trained_with="vlens transcoder train")
    if args.evaluate:
        held_out = samples(args, n=args.evaluate, seed=HELD_OUT_SEED + args.seed)
        evaluation = evaluate_transcoders(model, result.transcoders, held_out, batch_size=args.prompts_per_forward,
                                          progress=not args.quiet)
        result.metrics["evaluation"] = evaluation.to_dict()
        report(evaluation)
    result.save(out)
    if args.saelens:
        save_saelens_transcoders(result.transcoders, out, model_name=recorded_spec(args.model))
    m = result.metrics
    echo(f"transcoders ({args.kind}, {args.activation}, {args.d_tc} features x {len(source.layers)} layers): "
         f"{m['steps']} steps, explained variance {m.get('explained_variance', float('nan')):.3f}, "
         f"L0 {m.get('l0', float('nan')):.1f} -> {out}")
    return 0


def run_evaluate(args: argparse.Namespace) -> int:
    out = prepare_out(args, RESULTS_FILE)

    from vlens.transcoders import evaluate_transcoders, load_transcoders
    from vlens.utils.errors import failure_context

    with failure_context(f"reading the transcoders {args.transcoders}"):
        transcoders = load_transcoders(args.transcoders)
    choose_model(args, transcoders.cfg.metadata, f"the transcoders {args.transcoders}")
    model = load_model_from_args(args)
    evaluation = evaluate_transcoders(model, transcoders, samples(args), batch_size=args.prompts_per_forward,
                                      progress=not args.quiet)
    write_results(out, {**evaluation.to_dict(), "transcoders": str(args.transcoders), "model": args.model})
    report(evaluation)
    return 0

"""`vlens sae train` and `vlens sae dashboard`: sparse autoencoders on a model's activations.

    vlens sae train --model tiny --hook blocks.1.hook_resid_post --positions all --make 400 \\
        --architecture topk --d-sae 512 --k 16 --tokens 100000 --evaluate 64 --out runs/sae
    vlens sae dashboard --model tiny --sae runs/sae --make 100 --out runs/sae_dashboard
    vlens sae evaluate --model tiny --sae folder/saved/by/sae_lens --make 128 --out runs/sae_eval

`train` writes a SAELens folder (cfg.json + sae_weights.safetensors, loadable by
``sae_lens.SAE.load_from_disk``) and results.json (settings, training log, final metrics and, with
--evaluate N, loss recovered and answer accuracy with the SAE spliced at image / text / all
positions). `dashboard` writes dashboard.html (offline) and results.json (the feature views);
`evaluate` splices any SAE folder (vlens's or SAELens's) and writes the same measurements.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from vlens.cli.console import echo
from vlens.cli.dataset_options import add_data_arguments, load_data_arg, mark_input_paths
from vlens.cli.options import (
    RESULTS_FILE,
    add_model_options,
    add_out,
    checked_by,
    load_model_from_args,
    prepare_out,
    rendered_size,
    style_arg,
    task_arg,
    write_results,
)
from vlens.cli.recorded_model import choose_model, recorded_spec
from vlens.utils.errors import UserInputError
from vlens.utils.validation import arg_float, arg_int, arg_path

logger = logging.getLogger(__name__)

DASHBOARD = "dashboard.html"
HELD_OUT_SEED = 1_000_003  # evaluation samples never coincide with training samples
REGIONS = ("image", "text", "final", "all")


def add_sample_options(parser: argparse.ArgumentParser, recorded_by: str | None = None) -> None:
    """The model and sample options; recorded_by: what records the model when --model is not given."""
    add_model_options(parser, render_default="model", dtype_default="float32", recorded_by=recorded_by)
    source = parser.add_mutually_exclusive_group(required=True)
    add_data_arguments(parser, group=source, help="dataset with a question per image (any --format)")
    source.add_argument("--make", type=arg_int(min=1), metavar="N", help="generate N task-suite samples on the fly")
    parser.add_argument("--limit", type=arg_int(min=1), help="use at most this many rows of --data")
    parser.add_argument("--task", type=task_arg, default="counting", help="task of generated samples (default counting)")
    parser.add_argument("--style", type=style_arg, default="syndot", help="style of generated samples (default syndot)")
    parser.add_argument("--seed", type=arg_int(min=0), default=0, help="seed of generated samples and training")
    parser.add_argument("--prompts-per-forward", type=arg_int(min=1), default=16,
                        help="prompts per model forward (default 16)")


def _sae_args(parser: argparse.ArgumentParser) -> None:
    """The data options, plus --sae (a vlens or SAELens folder) and --hook."""
    add_sample_options(parser, recorded_by="the SAE folder")
    sae = parser.add_argument("--sae", required=True, type=arg_path, help="an SAE folder (vlens or SAELens)")
    mark_input_paths(parser, sae.dest)
    parser.add_argument("--hook", help="hook name (default: the SAE config's)")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = "Sparse autoencoders on a model's activations (docs/sae.md in the repository)."
    commands = parser.add_subparsers(dest="sae_command", metavar="SUBCOMMAND", required=True)

    train = commands.add_parser("train", help="train an SAE on one hook's activations",
                                description="Train an SAE on one hook's activations at chosen token positions.")
    add_sample_options(train)
    train.add_argument("--hook", required=True, help="hook name, e.g. blocks.1.hook_resid_post (vlens info --hooks)")
    train.add_argument("--positions", choices=REGIONS, default="image", help="token positions (default image)")
    train.add_argument("--cells", type=checked_by(parse_cells),
                       help="only these image-grid cells, 'row,col;row,col' (with --positions image)")
    train.add_argument("--architecture", choices=("standard", "topk", "jumprelu"), default="topk",
                       help="standard: ReLU with an L1 penalty; topk: the k largest features; jumprelu: a learnt "
                       "threshold per feature with an L0 penalty (docs/sae.md)")
    train.add_argument("--d-sae", type=arg_int(min=1), default=512, help="number of features (default 512)")
    train.add_argument("--k", type=arg_int(min=1), default=16, help="TopK: active features per token (default 16)")
    train.add_argument("--l1", type=arg_float(min=0), default=5.0, help="standard: L1 coefficient (default 5)")
    train.add_argument("--l0", type=arg_float(min=0), default=1.0, help="jumprelu: L0 coefficient (default 1)")
    train.add_argument("--lr", type=arg_float(min=0, min_open=True), default=1e-3, help="Adam learning rate")
    train.add_argument("--warmup-steps", type=arg_int(min=0), default=50, help="steps of linear learning-rate warm-up")
    train.add_argument("--decay", choices=("cosine", "linear", "constant"), default="cosine",
                       help="learning-rate schedule after the warm-up")
    train.add_argument("--tokens", type=arg_int(min=1), default=100_000, help="activations to train on (default 1e5)")
    train.add_argument("--batch-tokens", type=arg_int(min=1), default=512, help="activations per step (default 512)")
    train.add_argument("--buffer", type=arg_int(min=2), default=8192, help="shuffling buffer size (default 8192)")
    train.add_argument("--dead-features", choices=("auto", "aux", "resample", "none"), default="auto",
                       help="what revives features that stopped firing: aux (an auxiliary loss on them), resample "
                       "(restart them on badly reconstructed inputs), none; auto: aux for topk, else resample")
    train.add_argument("--cache-dir", type=arg_path, help="keep the activations on disk here (reused)")
    train.add_argument("--checkpoint-every", type=arg_int(min=0), default=0, help="steps between checkpoints")
    train.add_argument("--checkpoint-dir", type=arg_path,
                       help="full training state (default OUT.checkpoint; also written when Ctrl-C or an error stops the run)")
    train.add_argument("--resume", action="store_true", help="continue the run in --checkpoint-dir")
    train.add_argument("--stop-after", type=arg_int(min=1), help="end after N steps (continue with --resume)")
    train.add_argument("--evaluate", type=arg_int(min=1), metavar="N",
                       help="then splice the SAE on N held-out generated samples at image / text / all positions")
    add_out(train, f"the SAELens folder (cfg.json, sae_weights.safetensors) and {RESULTS_FILE}")
    train.set_defaults(func=run_train)

    dash = commands.add_parser("dashboard", help="an offline HTML dashboard of an SAE's features",
                               description="Top images (activation over the patches), top text positions and "
                                           "promoted tokens of an SAE's features, as one offline HTML page.")
    _sae_args(dash)
    dash.add_argument("--features", type=checked_by(parse_features), help="comma-separated feature indices (default: the most frequent)")
    dash.add_argument("--n-features", type=arg_int(min=1), default=32, help="how many when --features is not given")
    dash.add_argument("--top-k", type=arg_int(min=1), default=6, help="top images and text positions per feature")
    add_out(dash, f"{DASHBOARD} and {RESULTS_FILE} (the feature views)")
    dash.set_defaults(func=run_dashboard)

    evaluate = commands.add_parser("evaluate", help="splice an SAE (vlens or SAELens folder): loss recovered, accuracy",
                                   description="Splice an SAE at image / text / all positions and measure the answer "
                                               "loss recovered and the answer accuracy.")
    _sae_args(evaluate)
    evaluate.add_argument("--positions", type=checked_by(parse_regions), default="image,text,all",
                          help="comma-separated regions to splice at (default image,text,all)")
    add_out(evaluate, f"{RESULTS_FILE} (per region: answer loss clean / SAE / zeroed, loss recovered, accuracy)")
    evaluate.set_defaults(func=run_evaluate)


def parse_cells(text: str | None) -> tuple[tuple[int, int], ...] | None:
    if text is None:
        return None
    cells = []
    for item in text.split(";"):
        row, _, col = item.strip().partition(",")
        if not row.strip().isdigit() or not col.strip().isdigit():
            raise UserInputError(f"cannot read cell {item!r} of --cells: write 'row,col;row,col', e.g. 0,0;1,2")
        cells.append((int(row), int(col)))
    return tuple(cells)


def parse_features(text: str | None) -> tuple[int, ...] | None:
    if text is None:
        return None
    try:
        return tuple(int(t) for t in text.split(",") if t.strip())
    except ValueError:
        raise UserInputError(f"--features {text!r}: write comma-separated feature indices, e.g. 3,17,40") from None


def samples(args: argparse.Namespace, n: int | None = None, seed: int | None = None) -> list:
    """Dataset records (--data) or generated task samples (--make N)."""
    if n is None and args.data is not None:
        return list(load_data_arg(args, args.data, args.limit).examples)
    return generated_samples(args.task, args.style, n or args.make, args.seed if seed is None else seed,
                             rendered_size(args), "--task")


def generated_samples(task: str, style: str, count: int, start: int, size: int, flag: str) -> list:
    """`count` task-suite samples (dicts with image, question, answer, id) from seed `start`."""
    from vlens.data import TASKS, make_task_sample

    if task not in TASKS:
        raise UserInputError(f"{flag} {task!r}: choose one of {', '.join(TASKS)}")
    out = []
    for i in range(count):
        image, record = make_task_sample(task, seed=start + i, size=size, style=style)
        out.append({"image": image, **record, "id": f"{task}-{start + i}"})
    return out


def run_train(args: argparse.Namespace) -> int:
    cells = parse_cells(args.cells)
    if cells is not None and args.positions != "image":
        raise UserInputError("--cells choose image-grid cells: use them with --positions image")
    if args.buffer < 2 * args.batch_tokens:
        raise UserInputError(f"--buffer ({args.buffer}) must be at least twice --batch-tokens ({args.batch_tokens})")
    # the state is saved there also when Ctrl-C or an error stops the run, so --resume continues it
    checkpointing = bool(args.checkpoint_dir or args.checkpoint_every or args.resume or args.stop_after)
    checkpoint_dir = args.checkpoint_dir or Path(str(args.out).rstrip("/") + ".checkpoint")
    out = prepare_out(args, RESULTS_FILE, "cfg.json")

    from vlens.sae.activations import ActivationOptions, ActivationSource
    from vlens.sae.evaluation import evaluate_splice
    from vlens.sae.saelens_format import save_sae
    from vlens.sae.settings import SAETraining, TrainRun
    from vlens.sae.trainer import train_sae

    training = SAETraining(architecture=args.architecture, d_sae=args.d_sae, k=args.k, l1_coefficient=args.l1,
                           l0_coefficient=args.l0, lr=args.lr, warmup_steps=args.warmup_steps, decay=args.decay,
                           total_tokens=args.tokens, batch_size=args.batch_tokens, buffer_size=args.buffer,
                           dead_features=args.dead_features, seed=args.seed)
    run = TrainRun(checkpoint_dir=checkpoint_dir, checkpoint_every=args.checkpoint_every, resume=args.resume,
                   stop_after=args.stop_after, final_checkpoint=checkpointing, progress=not args.quiet)
    model = load_model_from_args(args)
    model.check_hook_name(args.hook)
    examples = samples(args)
    source = ActivationSource(model, examples, ActivationOptions(args.hook, positions=args.positions, cells=cells,
                                                                 prompts_per_chunk=args.prompts_per_forward),
                              cache_dir=args.cache_dir)
    result = train_sae(source, training, run)
    result.sae.cfg.metadata.update(model_name=recorded_spec(args.model), positions=args.positions,
                                   trained_with="vlens sae train")
    payload = result.to_dict()
    if args.evaluate:
        held_out = samples(args, n=args.evaluate, seed=HELD_OUT_SEED + args.seed)
        evaluation = evaluate_splice(model, held_out, result.sae, args.hook, batch_size=args.prompts_per_forward)
        payload["evaluation"] = evaluation.to_dict()
        for row in evaluation.rows:
            recovered = "n/a" if row["loss_recovered"] is None else f"{row['loss_recovered']:.3f}"
            echo(f"spliced at {row['positions']}: loss recovered {recovered}, accuracy "
                 f"{row['accuracy_sae']:.3f} (clean {row['accuracy_clean']:.3f}, zeroed {row['accuracy_zero']:.3f})")
    save_sae(result.sae, out)
    write_results(out, payload)
    m = result.metrics
    echo(f"SAE ({args.architecture}, {args.d_sae} features) on {args.hook} at {args.positions} positions: "
         f"{m['steps']} steps, explained variance {m.get('explained_variance', float('nan')):.3f}, "
         f"L0 {m.get('l0', float('nan')):.1f}, dead {m.get('dead_fraction', float('nan')):.3f} -> {out}")
    return 0


def _load_sae_arg(args: argparse.Namespace):
    from vlens.sae.saelens_format import load_sae
    from vlens.utils.errors import failure_context

    with failure_context(f"reading the SAE folder {args.sae}"):
        sae = load_sae(args.sae)
    hook = args.hook or sae.cfg.hook_name
    if hook is None:
        raise UserInputError(f"{args.sae} names no hook: pass --hook")
    choose_model(args, sae.cfg.metadata, f"the SAE folder {args.sae}")
    return sae, hook


def parse_regions(text: str) -> list[str]:
    """--positions of `sae evaluate`: comma-separated regions."""
    regions = [r.strip() for r in text.split(",") if r.strip()]
    unknown = [r for r in regions if r not in REGIONS]
    if unknown or not regions:
        raise UserInputError(f"--positions {text!r}: choose comma-separated regions from {', '.join(REGIONS)}")
    return regions


def run_evaluate(args: argparse.Namespace) -> int:
    regions = parse_regions(args.positions)
    out = prepare_out(args, RESULTS_FILE)

    from vlens.sae.evaluation import evaluate_splice

    sae, hook = _load_sae_arg(args)
    model = load_model_from_args(args)
    model.check_hook_name(hook)
    evaluation = evaluate_splice(model, samples(args), sae, hook, positions=regions,
                                 batch_size=args.prompts_per_forward)
    write_results(out, {**evaluation.to_dict(), "sae": str(args.sae), "model": args.model})
    for row in evaluation.rows:
        recovered = "n/a" if row["loss_recovered"] is None else f"{row['loss_recovered']:.3f}"
        echo(f"spliced at {row['positions']}: loss recovered {recovered}, accuracy {row['accuracy_sae']:.3f} "
             f"(clean {row['accuracy_clean']:.3f}, zeroed {row['accuracy_zero']:.3f})")
    return 0


def run_dashboard(args: argparse.Namespace) -> int:
    features = parse_features(args.features)
    out = prepare_out(args, RESULTS_FILE, DASHBOARD)

    from vlens.sae.features import FeatureViewOptions, example_image, feature_views
    from vlens.viz.sae_dashboard import write_dashboard

    sae, hook = _load_sae_arg(args)
    model = load_model_from_args(args)
    model.check_hook_name(hook)
    examples = samples(args)
    views = feature_views(model, sae, examples, FeatureViewOptions(features=features, n_features=args.n_features,
                                                                   top_k=args.top_k,
                                                                   prompts_per_chunk=args.prompts_per_forward),
                          hook_name=hook)
    payload = views.to_dict()
    images = {hit["example"]: example_image(examples, hit["example"])
              for f in payload["features"] for hit in f["top_images"]}
    write_dashboard(out / DASHBOARD, payload["features"], {k: v for k, v in images.items() if v is not None},
                    title=f"SAE features at {hook}",
                    description=f"{sae.cfg.architecture} SAE, {sae.cfg.d_sae} features, on {len(examples)} examples "
                                f"({views.n_tokens} tokens) of {args.model}")
    write_results(out, payload)
    echo(f"{len(views.views)} features -> {out / DASHBOARD}")
    return 0

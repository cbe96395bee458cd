"""``vlens patch``: visual activation patching sweeps and attribution patching from the command line.

    vlens patch --model tiny --make-pairs 32 --mode layer-region --out runs/vap
    vlens patch --model tiny --pairs data/pairs --mode layer-head --out runs/heads
    vlens patch --model tiny --make-pairs 32 --mode atp --compare-exact --out runs/atp
    vlens patch --model MOE_DIR --make-pairs 32 --mode layer-expert --region image --out runs/experts
    vlens patch --model tiny --make-pairs 16 --video-frames 4 --mode layer-frame --out runs/frames

``--pairs PATH`` reads any dataset (``--format``) whose rows have ``pair_id`` / ``role`` columns
(``vlens data pairs``); a set without them is refused with what to do instead.
The clean / corrupt answers are the records' ground-truth answers; metrics compare their first
differing tokens at the final prompt position of the chat-formatted prompt. Writes
``results.json`` and ``figure.html`` (plotly) into ``--out``.
"""

from __future__ import annotations

import argparse
import logging

from vlens.cli.console import echo, non_finite_exit
from vlens.cli.dataset_options import add_data_arguments, load_data_arg
from vlens.cli.options import (
    RESULTS_FILE,
    add_model_options,
    add_out,
    load_model_from_args,
    prepare_out,
    rendered_size,
    style_arg,
    write_figure,
    write_results,
)
from vlens.utils.errors import UserInputError
from vlens.utils.finite import add_allow_nan_argument
from vlens.utils.validation import arg_int

logger = logging.getLogger(__name__)

MODES = ("layer-region", "layer-pos", "layer-head", "layer-expert", "layer-frame", "atp")
FIGURE_FILE = "figure.html"


def add_pair_arguments(parser: argparse.ArgumentParser) -> None:
    """--pairs PATH | --make-pairs N, and --only-correct, --limit, --seed, --style, --batch-size
    (read with `load_examples` / `load_batch`)."""
    source = parser.add_mutually_exclusive_group(required=True)
    add_data_arguments(parser, flag="--pairs", group=source,
                       help="dataset of pairs: rows with pair_id / role ('clean' / 'corrupt') columns "
                            "(vlens data pairs --out DIR, or any --format with those columns)")
    source.add_argument("--make-pairs", type=arg_int(min=1), metavar="N", help="generate N controlled counting pairs")
    parser.add_argument("--only-correct", action="store_true",
                        help="keep only pairs whose clean and corrupt runs both predict their own answer")
    parser.add_argument("--limit", type=arg_int(min=1), default=None, help="use at most this many pairs of --pairs")
    parser.add_argument("--seed", type=arg_int(min=0), default=0, help="seed of --make-pairs (default 0)")
    parser.add_argument("--style", type=style_arg, default="syndot", help="style of --make-pairs (default syndot)")
    parser.add_argument("--video-frames", type=arg_int(min=1), default=None, metavar="N",
                        help="with --make-pairs: video pairs of N frames whose objects appear across the frames, for "
                        "the families that take video (docs/video.md)")
    parser.add_argument("--batch-size", "--pair-batch-size", dest="batch_size", type=arg_int(min=1), default=None,
                        metavar="N", help="pairs per forward: run the pairs in chunks of this many (memory); default "
                        "all at once (--pair-batch-size is the old spelling)")


def configure(parser: argparse.ArgumentParser) -> None:
    add_model_options(parser, render_default="model")
    add_pair_arguments(parser)
    parser.add_argument("--mode", choices=MODES, required=True,
                        help="what is patched: one layer x region (image / text / final) grid, one layer x position grid, "
                        "each head, each expert, each frame of video pairs (layer-frame, with --video-frames), or atp "
                        "(attribution patching: the first-order estimate of every head)")
    add_out(parser, f"{RESULTS_FILE} and {FIGURE_FILE}")
    parser.add_argument("--component", default="resid_pre", choices=("resid_pre", "attn_out", "mlp_out"),
                        help="activation patched in layer-region / layer-pos / layer-frame mode (default resid_pre)")
    parser.add_argument("--region", default="all", choices=("all", "image", "text", "final"),
                        help="positions patched in layer-head / layer-expert mode (default all)")
    parser.add_argument("--metric", default="overwrite_rate", help=f"metric shown in {FIGURE_FILE} "
                        "(default overwrite_rate)")
    parser.add_argument("--direction", default="noising", choices=("noising", "denoising"),
                        help="noising (default): patch the corrupt run's activations into the clean run; denoising: "
                        "the clean run's into the corrupt run (TransformerLens's get_act_patch_* convention); the "
                        "metrics read the patched run against the run patched from (docs/method.md)")
    parser.add_argument("--method", default="fast", choices=("fast", "naive"),
                        help="fast: many patched runs stacked in one batch; naive: one forward per patch (the reference)")
    parser.add_argument("--compare-exact", action="store_true", help="atp: also run the exact head sweep, report Spearman")
    parser.add_argument("--max-batch", type=arg_int(min=1), default=64,
                        help="rows per forward in the fast path (default 64)")
    add_allow_nan_argument(parser)
    parser.set_defaults(func=run_patch, shardable=True)  # torchrun splits the forwards (vlens.parallel)


def load_examples(args: argparse.Namespace):
    """The pairs (`PairExample`s) the arguments ask for: --pairs (minus control pairs) or --make-pairs."""
    from vlens.patching.pairs import make_count_pairs, make_video_count_pairs, pairs_from_dataset

    frames = getattr(args, "video_frames", None)
    if frames is not None and args.pairs:
        raise UserInputError("--video-frames makes video pairs: use it with --make-pairs N, not --pairs")
    if frames is not None:
        return make_video_count_pairs(args.make_pairs, seed=args.seed, frames=frames,
                                      size=rendered_size(args), style=args.style)
    if args.pairs:
        examples = pairs_from_dataset(load_data_arg(args, args.pairs))
        patchable = [e for e in examples if e.clean_answer != e.corrupt_answer]
        if len(patchable) < len(examples):
            logger.warning("skipping %d control pairs whose clean and corrupt answers are equal",
                           len(examples) - len(patchable))
        if not patchable:
            raise UserInputError(f"no pair in {args.pairs} has different clean and corrupt answers; patching "
                                 "needs count pairs (vlens data pairs --kind count)")
        examples = patchable[: args.limit] if args.limit is not None else patchable
    else:
        examples = make_count_pairs(args.make_pairs, seed=args.seed, size=rendered_size(args),
                                    style=args.style)
    return examples


def load_batch(model, args: argparse.Namespace, examples=None):
    """The PairBatch the arguments ask for (optionally only the pairs the model gets right);
    `examples`: the pairs already read with `load_examples`."""
    from vlens.patching.pairs import build_pair_batch

    batch = build_pair_batch(model, load_examples(args) if examples is None else examples)
    if args.only_correct:
        from vlens.patching.conditions import correct_pairs

        batch = correct_pairs(model, batch, what="--only-correct")
    return batch


def run_patch(args: argparse.Namespace) -> int:
    from vlens.parallel.options import SweepOptions
    from vlens.patching import sweeps
    from vlens.patching.metrics import METRICS
    from vlens.utils.finite import collect_non_finite
    from vlens.utils.validation import check_choice

    if args.mode == "layer-frame" and args.video_frames is None:
        raise UserInputError("--mode layer-frame patches the frames of video pairs: add --video-frames N (with "
                             "--make-pairs)")
    if args.mode != "atp":  # everything the user gave is checked before the model loads
        check_choice(args.metric, "--metric", METRICS)
    elif args.direction != "noising":
        raise UserInputError("--mode atp estimates noising (corrupt into clean) only: drop --direction denoising")
    out = prepare_out(args, RESULTS_FILE, FIGURE_FILE)
    model = load_model_from_args(args)
    batch = load_batch(model, args)
    options = SweepOptions(batch_size=args.batch_size, max_batch=args.max_batch, implementation=args.method,
                           progress=not args.quiet, sharding=args.sharding)
    with collect_non_finite() as problems:
        if args.mode == "layer-region":
            result = sweeps.patch_layer_region(model, batch, component=args.component, direction=args.direction,
                                               options=options)
        elif args.mode == "layer-pos":
            result = sweeps.patch_layer_position(model, batch, component=args.component, direction=args.direction,
                                                 options=options)
        elif args.mode == "layer-head":
            result = sweeps.patch_layer_head(model, batch, region=args.region, direction=args.direction,
                                             options=options)
        elif args.mode == "layer-frame":
            result = sweeps.patch_layer_frame(model, batch, component=args.component, direction=args.direction,
                                              options=options)
        elif args.mode == "layer-expert":
            result = _run_experts(model, batch, args, options)
        else:
            result = _run_atp(model, batch, args, options)
    if not args.sharding.is_main:  # every rank holds the result; rank 0 writes it
        return non_finite_exit(problems, True, "vlens patch")
    payload = result.to_dict()
    payload["model"] = args.model
    payload["world_size"] = args.sharding.world_size
    written = [write_results(out, payload),
               write_figure(lambda: result.plot("z") if args.mode == "atp" else result.plot(args.metric),
                            out / FIGURE_FILE)]
    logger.info("wrote %s (%s, %d pairs)", ", ".join(str(p) for p in written if p), args.mode, batch.n_pairs)
    return non_finite_exit(problems, args.allow_nan, "vlens patch")


def _run_experts(model, batch, args, options):
    """layer-expert: each expert's contribution of each MoE layer patched alone (`vlens.patching.experts`)."""
    from vlens.patching.experts import patch_layer_expert

    if args.sharding.world_size > 1:
        raise UserInputError("--mode layer-expert runs in one process: start it without torchrun")
    return patch_layer_expert(model, batch, region=args.region, direction=args.direction,
                              options=options.replace(sharding=None))


def _run_atp(model, batch, args, options):
    from vlens.patching.attribution import attribution_patching
    from vlens.patching.sweeps import patch_layer_head

    result = attribution_patching(model, batch, options=options)
    if args.compare_exact:
        exact = patch_layer_head(model, batch, region="all", options=options)
        result.exact_z = exact.metrics["logit_diff"] - exact.baseline.clean_logit_diff.mean()
        echo(f"Spearman(AtP z, exact head sweep) = {result.spearman_z:.3f}")
    return result

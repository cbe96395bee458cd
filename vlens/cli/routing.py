"""``vlens routing``: which experts image tokens and text tokens are routed to, per mixture-of-experts layer.

    vlens routing --model MOE_DIR --make 64 --out runs/routing
    vlens routing --model MOE_DIR --data data/counting --limit 200 --out runs/routing

``--data`` reads any dataset with images and questions (``--format``); ``--make N`` renders N
task-suite images (counting, colour, shape, ...) on the fly. Each example runs once through the model
in its chat format; every real token is counted in its region (image placeholder tokens, or text).
Writes ``results.json`` (`vlens.routing.RoutingStatistics`: counts, shares, routing weights and the
image-text Jensen-Shannon divergence per layer) and ``routing.html`` into ``--out``.
"""

from __future__ import annotations

import argparse
import logging

from vlens.cli.console import echo
from vlens.cli.dataset_options import add_data_arguments, load_data_arg
from vlens.cli.options import (
    RESULTS_FILE,
    add_batch_size,
    add_model_options,
    add_out,
    load_model_from_args,
    prepare_out,
    rendered_size,
    style_arg,
    write_figure,
    write_results,
)
from vlens.utils.validation import arg_int

logger = logging.getLogger(__name__)

FIGURE_FILE = "routing.html"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = ("Count, per mixture-of-experts layer, how often each expert is among the top-k of image "
                          "tokens and of text tokens, with each region's routing distribution and their divergence.")
    add_model_options(parser, render_default="model")
    source = parser.add_mutually_exclusive_group(required=True)
    add_data_arguments(parser, group=source, help="dataset with images and questions (imagefolder, PixMo-Count, "
                       "CountBenchQA, multiple choice, qa rows; see --format)")
    source.add_argument("--make", type=arg_int(min=1), metavar="N", help="render N task-suite samples on the fly")
    add_out(parser, f"{RESULTS_FILE} and {FIGURE_FILE}")
    parser.add_argument("--limit", type=arg_int(min=1), default=None, help="use at most this many records of --data")
    add_batch_size(parser, 8)
    parser.add_argument("--seed", type=arg_int(min=0), default=0, help="seed of --make (default 0)")
    parser.add_argument("--style", type=style_arg, default="synpoly", help="style of --make (default synpoly)")
    parser.set_defaults(func=run_routing)


def _samples(args: argparse.Namespace) -> list[tuple]:
    """(image, question) pairs of --data or --make."""
    if args.data:
        from vlens.datasets import record_dicts

        return [(row["image"], row["question"]) for row in record_dicts(load_data_arg(args, args.data), args.limit)]
    from vlens.data import TASKS, make_task_sample

    size = rendered_size(args)
    samples = []
    for i in range(args.make):
        image, record = make_task_sample(TASKS[i % len(TASKS)], seed=args.seed + i, size=size, style=args.style)
        samples.append((image, record["question"]))
    return samples


def run_routing(args: argparse.Namespace) -> int:
    from vlens.routing import routing_statistics
    from vlens.utils.errors import UserInputError

    out = prepare_out(args, RESULTS_FILE, FIGURE_FILE)
    samples = _samples(args)  # read (and checked) before the model
    if not samples:
        raise UserInputError("no examples to route: --data has no readable rows")
    model = load_model_from_args(args)
    if not model.cfg.moe_layers:
        raise UserInputError(f"{model.cfg.architecture} has no mixture-of-experts layer: `vlens routing` needs a MoE "
                             "model (Qwen3-VL-MoE, Qwen3.5-MoE)")
    size = args.batch_size
    batches = (model.prepare(images=[s[0] for s in samples[i:i + size]], prompts=[s[1] for s in samples[i:i + size]])
               for i in range(0, len(samples), size))
    stats = routing_statistics(model, batches, progress=not args.quiet)
    stats.settings.update(model_arg=args.model, n_samples=len(samples), source=str(args.data or f"--make {args.make}"))
    written = [write_results(out, stats.to_dict()), write_figure(stats.plot, out / FIGURE_FILE)]
    echo(stats.summary())
    logger.info("wrote %s", ", ".join(str(p) for p in written if p))
    return 0

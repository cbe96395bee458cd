"""``vlens knockout``: the attention-knockout sweep over layer windows (`vlens.flow.sweep`).

    vlens knockout --from image --to final --window 3 --task colour --n 64 --out runs/knockout
    vlens knockout --model llava-hf/llava-1.5-7b-hf --data data/objects --edge image->final \\
        --edge question->final --edge object->final --window 9 --out runs/knockout

Each edge SRC->DST blocks attention from DST's query positions to SRC's key positions in every
window of --window layers; per window the answer's relative probability change and logit-margin
change are averaged over the examples with 95% bootstrap intervals. Regions: image, question, text,
final, prompt, all, and object (the tokens of each example's object box). ``--data`` reads a vlens
imagefolder (object boxes from its metadata) or any dataset with images, questions and answers;
``--task`` renders object-task examples on the fly. Writes ``results.json`` (`KnockoutSweep`) and
``knockout.html`` into ``--out``.
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
    checked_by,
    load_model_from_args,
    prepare_out,
    rendered_size,
    write_figure,
)
from vlens.utils.validation import arg_int
from vlens.zoo.image_sizes import OBJECT_IMAGE_SIZE

logger = logging.getLogger(__name__)

FIGURE_FILE = "knockout.html"
# the names of vlens.flow.batch.TASK_NAMES and vlens.flow.sweep.ENDPOINTS (a test keeps them equal)
OBJECT_TASK_NAMES = ("name", "colour_at", "colour", "shape")
REGIONS = ("image", "text", "final", "all", "question", "prompt", "object")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = ("Knock out attention edges (SRC->DST: DST's queries no longer read SRC's keys) in windows "
                          "of layers and measure the answer's probability change with intervals over examples.")
    add_model_options(parser, render_default="model", render_fallback=OBJECT_IMAGE_SIZE)
    source = parser.add_mutually_exclusive_group()
    add_data_arguments(parser, group=source, help="dataset with images, questions and answers (a vlens imagefolder "
                       "gives object boxes; see --format)")
    source.add_argument("--task", choices=OBJECT_TASK_NAMES, default=None,
                        help="render examples of this object task on the fly (default colour when --data is not given)")
    parser.add_argument("--n", type=arg_int(min=1), default=32, help="examples to render with --task (default 32)")
    parser.add_argument("--limit", type=arg_int(min=1), default=None, help="use at most this many records of --data")
    parser.add_argument("--from", dest="src", choices=REGIONS, default=None, metavar="REGION",
                        help=f"key side of one edge, one of {', '.join(REGIONS)} (with --to; default image)")
    parser.add_argument("--to", dest="dst", choices=REGIONS, default=None, metavar="REGION",
                        help="query side of that edge (default final)")
    parser.add_argument("--edge", action="append", type=edge_arg, default=None, metavar="SRC->DST",
                        help="an edge to sweep (repeatable; with neither --from/--to nor --edge: image->final, "
                        "image->question, question->final, object->final)")
    parser.add_argument("--window", type=arg_int(min=1), default=3, metavar="K", help="layers per window (default 3)")
    parser.add_argument("--seed", type=arg_int(min=0), default=0, help="first seed of --task examples (default 0)")
    add_batch_size(parser, 16)
    add_out(parser, f"{RESULTS_FILE} and {FIGURE_FILE}")
    parser.set_defaults(func=run_knockout)


def edge_arg(text: str) -> str:
    """--edge SRC->DST, checked while parsing (`vlens.flow.sweep.parse_edge`)."""
    from vlens.flow.sweep import parse_edge

    return checked_by(parse_edge)(text)


def edges_of(args: argparse.Namespace) -> tuple[str, ...]:
    """The edges the flags ask for (None: the sweep's defaults)."""
    edges = list(args.edge or [])
    if args.src is not None or args.dst is not None:
        edges.insert(0, f"{args.src or 'image'}->{args.dst or 'final'}")
    return tuple(edges)


def flow_batch_of(args: argparse.Namespace):
    """The `FlowBatch` of --data or --task (read and checked before the model loads)."""
    from pathlib import Path

    from vlens.data import read_imagefolder
    from vlens.datasets import record_dicts
    from vlens.flow.batch import FlowBatch, object_task_batch

    if args.data is None:
        return object_task_batch(args.task or "colour", args.n, seed=args.seed, size=rendered_size(args, fallback=OBJECT_IMAGE_SIZE))
    folder = Path(args.data)
    records: list[dict]
    if folder.is_dir() and (folder / "metadata.jsonl").is_file() and args.data_format in (None, "imagefolder"):
        records = list(read_imagefolder(folder)[: args.limit])  # keeps the objects' boxes and the question's targets
    else:
        records = record_dicts(load_data_arg(args, args.data), args.limit)
    return FlowBatch.from_records(records, name=folder.name)


def run_knockout(args: argparse.Namespace) -> int:
    from vlens.flow.sweep import DEFAULT_EDGES, SweepSettings, knockout_sweep

    out = prepare_out(args, RESULTS_FILE, FIGURE_FILE)
    edges = edges_of(args) or DEFAULT_EDGES
    batch = flow_batch_of(args)
    if not batch.has_objects:
        dropped = [edge for edge in edges if "object" in edge]
        if dropped and (args.edge or args.src or args.dst):
            from vlens.utils.errors import UserInputError

            raise UserInputError(f"{', '.join(dropped)} need object boxes, which these examples do not have; use a "
                                 "vlens imagefolder with objects and targets, or --task")
        edges = tuple(edge for edge in edges if edge not in dropped)
    settings = SweepSettings(edges=edges, window=args.window, batch_size=args.batch_size)  # checked before loading
    model = load_model_from_args(args)
    result = knockout_sweep(model, batch, settings=settings, progress=not args.quiet)
    result.settings["model_arg"] = args.model
    written = [result.save(out), write_figure(result.plot, out / FIGURE_FILE)]
    echo(result.table())
    logger.info("wrote %s", ", ".join(str(p) for p in written if p))
    return 0

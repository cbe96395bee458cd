"""``vlens logit-lens``: the logit lens at the final prompt position over a dataset.

    vlens logit-lens --model tiny --data data/counting --out runs/logit_lens
    vlens logit-lens --model tiny --make 64 --out runs/logit_lens

``--data DIR`` reads an imagefolder with ``question`` and ``answer`` columns (``vlens data``);
``--make N`` renders N counting images on the fly. Each record's ``answer`` is scored whole
(vlens.core.answers: teacher-forced over all its tokens, so "12" under Qwen's digit tokenizer is
"1" then "2"); results.json lists every answer's tokens. Writes ``results.json`` and
``logit_lens.html`` into ``--out``.
"""

from __future__ import annotations

import argparse
import logging

from vlens.cli.console import echo, non_finite_exit
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
from vlens.utils.finite import add_allow_nan_argument
from vlens.utils.validation import arg_int

logger = logging.getLogger(__name__)

FIGURE_FILE = "logit_lens.html"


def configure(parser: argparse.ArgumentParser) -> None:
    add_model_options(parser, render_default="model")
    source = parser.add_mutually_exclusive_group(required=True)
    add_data_arguments(parser, group=source, help="dataset with questions and answers (imagefolder, PixMo-Count, "
                       "CountBenchQA, multiple choice, qa rows; see --format)")
    source.add_argument("--make", type=arg_int(min=1), metavar="N", help="render N counting samples on the fly")
    add_out(parser, f"{RESULTS_FILE} and {FIGURE_FILE}")
    parser.add_argument("--limit", type=arg_int(min=1), default=None, help="use at most this many records of --data")
    add_batch_size(parser, 16)
    parser.add_argument("--seed", type=arg_int(min=0), default=0, help="seed of --make (default 0)")
    parser.add_argument("--style", type=style_arg, default="syndot", help="style of --make (default syndot)")
    add_allow_nan_argument(parser)
    parser.set_defaults(func=run_logit_lens, shardable=True)  # torchrun splits the batches (vlens.parallel)


def _records(args: argparse.Namespace, model):
    if args.data:
        from vlens.core.processing import image_refusal
        from vlens.datasets import record_dicts

        # an image the model's processor refuses is skipped by name, like one that does not decode
        return record_dicts(load_data_arg(args, args.data, args.limit), args.limit,
                            refusal=lambda image: image_refusal(model.processor, image))
    from vlens.data import make_task_sample
    from vlens.parallel import LazyItems

    size = rendered_size(args)

    def build(i: int) -> dict:  # sample i depends on the seed and i only: each process renders its own
        image, record = make_task_sample("counting", seed=args.seed * 100_003 + i, size=size, style=args.style)
        return {**record, "image": image}

    return LazyItems(args.make, build)


def run_logit_lens(args: argparse.Namespace) -> int:
    from vlens.lens.logit_lens import logit_lens_records
    from vlens.parallel.options import SweepOptions
    from vlens.utils.finite import collect_non_finite

    out = prepare_out(args, RESULTS_FILE, FIGURE_FILE)
    model = load_model_from_args(args)
    with collect_non_finite() as problems:
        result = logit_lens_records(model, _records(args, model), options=SweepOptions(
            batch_size=args.batch_size, progress=not args.quiet, sharding=args.sharding))
    if not args.sharding.is_main:  # every rank holds the result; rank 0 writes it
        return non_finite_exit(problems, True, "vlens logit-lens")
    path = write_results(out, {**result.to_dict(), "world_size": args.sharding.world_size})
    figure = write_figure(result.plot, out / FIGURE_FILE)
    logger.info("wrote %s%s (%d examples)", path, f" and {figure}" if figure else "", len(result.answers))
    for layer in range(result.n_layers):
        echo(f"layer {layer}: p(answer)={float(result.mean_probability[layer]):.3f} "
              f"median rank={float(result.median_rank[layer]):.0f} top1={float(result.top1_accuracy[layer]):.3f}")
    return non_finite_exit(problems, args.allow_nan, "vlens logit-lens")

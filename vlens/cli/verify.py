"""``vlens verify``: is vlens exact on this checkpoint? Compares HookedVLM with the plain HF model.

    vlens verify Qwen/Qwen2.5-VL-7B-Instruct --device cuda --dtype bfloat16 --out runs/verify
    vlens verify ./my-finetune --out runs/verify_mine
    vlens verify random-tiny

On built-in images and prompts (one image, two images, text only, a padded batch; video where the
family takes it) it checks logits (max abs / relative difference, top-1 agreement), greedy generation
(identical tokens), hook coverage (every documented hook fires with its documented shape), causality
(a zeroed hook_z and a one-hot pattern change the output as a hand computation says), and measures
time and memory against HF. Prints a table; with ``--out`` writes ``results.json`` (loads back with
``vlens.load_result``) and ``verified.json`` (the row of docs/verified-models.md). Exits 1 naming the
failed checks (a folder that does not load fails the "load" check), 0 when all pass. Tolerances per
dtype: docs/verified-models.md.
"""

from __future__ import annotations

import argparse
import logging

from vlens.cli.console import echo
from vlens.cli.options import RESULTS_FILE, add_model_options, add_out, prepare_out
from vlens.utils.validation import arg_int

logger = logging.getLogger(__name__)

ROW_FILE = "verified.json"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("spec", nargs="?", default=None, metavar="MODEL",
                        help="the model to verify: a hub id, a local folder, tiny or random-tiny (same as --model)")
    add_model_options(parser)
    add_out(parser, f"{RESULTS_FILE} and {ROW_FILE}", required=False)
    parser.add_argument("--max-new-tokens", type=arg_int(min=1), default=6, metavar="N",
                        help="greedy tokens compared per generation case (default 6)")
    parser.add_argument("--repeats", type=arg_int(min=1), default=3, metavar="N",
                        help="interleaved timing runs of each forward (default 3)")
    parser.set_defaults(func=run_verify)


def run_verify(args: argparse.Namespace) -> int:
    from vlens.cli.options import model_options
    from vlens.utils.errors import UserInputError
    from vlens.verify import VerifySettings, verify_spec

    if args.spec is not None:
        if args.model not in (None, "tiny") and args.model != args.spec:
            raise UserInputError(f"give the model once: MODEL {args.spec!r} or --model {args.model!r}")
        args.model = args.spec
    out = prepare_out(args, RESULTS_FILE, ROW_FILE) if args.out is not None else None
    options = model_options(args)
    options.pop("progress", None)
    spec = args.model
    result = verify_spec(spec, settings=VerifySettings(max_new_tokens=args.max_new_tokens, repeats=args.repeats),
                         progress=not args.quiet, **options)
    rows = [["check", "case", "status", "figures", "detail"], *result.table_rows()]
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    for row in rows:
        echo("  ".join(cell.ljust(width) for cell, width in zip(row[:4], widths, strict=True)) + "  " + row[4])
    if out is not None:
        path = result.save(out)
        logger.info("wrote %s and %s", path, out / ROW_FILE)
    if result.passed:
        echo(f"vlens verify {spec}: every check passed ({result.dtype} on {result.device})")
        return 0
    echo(f"vlens verify {spec}: FAILED {', '.join(result.failed_checks())}")
    return 1

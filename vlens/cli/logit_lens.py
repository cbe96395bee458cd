"""``vlens logit-lens``: the logit lens at the final prompt position over a dataset.

    vlens logit-lens --model tiny --data data/counting --out runs/logit_lens.json --html runs/logit_lens.html
    vlens logit-lens --model tiny --make 64 --out runs/logit_lens.json

``--data DIR`` reads an imagefolder with ``question`` and ``answer`` columns (``vlens data``);
``--make N`` renders N counting images on the fly. Each record's ``answer`` is scored whole
(vlens.answers: teacher-forced over all its tokens, so "12" under Qwen's digit tokenizer is
"1" then "2"); results.json lists every answer's tokens.
"""

from __future__ import annotations

import argparse
import sys

from vlens.finite import add_allow_nan_argument, collect_non_finite, non_finite_exit
from vlens.validation import arg_int, check_output_file


def add_cli(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("logit-lens", help="Logit lens per layer at the final prompt position.")
    parser.add_argument("--model", default="tiny", help="'tiny' (embedded), 'random-tiny', or a path / hub id")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--data", metavar="DIR", help="imagefolder with question / answer columns")
    source.add_argument("--make", type=arg_int(min=1), metavar="N", help="render N counting samples on the fly")
    parser.add_argument("--out", required=True, help="results JSON path")
    parser.add_argument("--html", help="also write the plotly figure as HTML")
    parser.add_argument("--limit", type=arg_int(min=1), default=None, help="use at most this many records of --data")
    parser.add_argument("--batch-size", type=arg_int(min=1), default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--size", type=arg_int(min=28), default=168)
    parser.add_argument("--style", default="syndot")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    add_allow_nan_argument(parser)
    parser.set_defaults(func=run_logit_lens)


def _records(args: argparse.Namespace) -> list[dict]:
    if args.data:
        from vlens.data import read_imagefolder

        records = read_imagefolder(args.data)
        return records[: args.limit] if args.limit is not None else records
    from vlens.data import make_task_sample

    out = []
    for i in range(args.make):
        image, record = make_task_sample("counting", seed=args.seed * 100_003 + i, size=args.size, style=args.style)
        out.append({**record, "image": image})
    return out


def run_logit_lens(args: argparse.Namespace) -> int:
    from vlens.info_cli import load_model_arg
    from vlens.lens.logit_lens import logit_lens_records

    try:
        for flag, path in (("--out", args.out), ("--html", args.html)):
            if path is not None:
                check_output_file(path, flag)
        model = load_model_arg(args.model)
        with collect_non_finite() as problems:
            result = logit_lens_records(model, _records(args), batch_size=args.batch_size, progress=not args.quiet)
    except (ValueError, FileNotFoundError) as error:
        print(f"vlens logit-lens: {error}", file=sys.stderr)
        return 2
    path = result.save(args.out)
    print(f"wrote {path} ({len(result.answers)} examples)")
    for layer in range(result.n_layers):
        print(f"  layer {layer}: p(answer)={float(result.mean_probability[layer]):.3f} "
              f"median rank={float(result.median_rank[layer]):.0f} top1={float(result.top1_accuracy[layer]):.3f}")
    if args.html:
        from pathlib import Path

        Path(args.html).parent.mkdir(parents=True, exist_ok=True)
        result.plot().write_html(args.html, include_plotlyjs="cdn")
        print(f"wrote {args.html}")
    return non_finite_exit(problems, args.allow_nan, "vlens logit-lens")

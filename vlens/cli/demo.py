"""`vlens demo`: run the counting-circuit study and write report.html + results.json.

    vlens demo --quick                       # embedded model, <= 5 minutes on 2 CPU cores
    vlens demo --model random-tiny --quick --out /tmp/demo
    vlens demo --model tiny --train          # measure the interventions table here
"""

from __future__ import annotations

import argparse
import sys

from vlens.validation import arg_int, check_output_folder


def add_cli(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("demo", help="The counting-circuit study end to end, as one HTML report.")
    parser.add_argument("--model", default="tiny",
                        help="'tiny' (embedded model, default), 'random-tiny', or a model folder / hub id")
    parser.add_argument("--out", default="vlens_demo", help="output folder (report.html, results.json)")
    parser.add_argument("--quick", action="store_true", help="small sizes: well under 5 minutes on 2 CPU cores (about 35 s with the embedded model)")
    parser.add_argument("--train", action="store_true",
                        help="measure the interventions table here (small LoRA SFT study) instead of reading it")
    parser.add_argument("--train-images", type=arg_int(min=1), default=16,
                        help="with --train: SynDot and SynPoly counting images (each) to fine-tune on (default 16)")
    parser.add_argument("--interventions", default=None, metavar="FILE",
                        help="stored interventions JSON (default: interventions.json in the model folder)")
    parser.add_argument("--threads", type=arg_int(min=1), default=1,
                        help="torch CPU threads (default 1: the tiny models gain nothing from more and run several "
                             "times faster with 1 on a busy machine; raise it for a large model on CPU)")
    parser.add_argument("--quiet", action="store_true", help="no stage lines or progress bars")
    parser.set_defaults(func=run_demo_cli)


def run_demo_cli(args: argparse.Namespace) -> int:
    from vlens.demo.pipeline import run_demo

    try:
        check_output_folder(args.out, "--out")  # before the study runs
        outcome = run_demo(args.model, args.out, quick=args.quick, train=args.train,
                           interventions_file=args.interventions, progress=not args.quiet, threads=args.threads,
                           train_images=args.train_images)
    except (FileNotFoundError, ValueError) as err:
        print(f"vlens demo: error: {err}", file=sys.stderr)
        return 2
    skipped = [s.title for s in outcome.sections if s.status != "ok"]
    print(f"wrote {outcome.report_path} and {outcome.results_path} in {outcome.timings['total']:.1f} s")
    for title in skipped:
        print(f"  skipped: {title}")
    return 0

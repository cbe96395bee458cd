"""`vlens demo`: run the counting-circuit study and write report.html + results.json.

    vlens demo --quick --out runs/demo       # embedded model, <= 5 minutes on 2 CPU cores
    vlens demo --model random-tiny --quick --out /tmp/demo
    vlens study --out runs/study && vlens demo --interventions runs/study/study.json --out runs/demo
"""

from __future__ import annotations

import argparse
import json
import logging

from vlens.cli.console import echo
from vlens.cli.dataset_options import mark_input_paths
from vlens.cli.options import (
    RESULTS_FILE,
    add_model_options,
    add_out,
    model_options,
    prepare_out,
)
from vlens.utils.clock import seconds_since_process_start
from vlens.utils.validation import arg_int

logger = logging.getLogger(__name__)

REPORT_FILE = "report.html"
DEFAULT_OUT = "vlens_demo"


def configure(parser: argparse.ArgumentParser) -> None:
    add_model_options(parser, render_default="model")
    add_out(parser, f"{REPORT_FILE} and {RESULTS_FILE}", default=DEFAULT_OUT)
    parser.add_argument("--quick", action="store_true",
                        help="small sizes: well under 5 minutes on 2 CPU cores (with the embedded model its stages take 40-48 s of CPU; benchmarks/RESULTS.md)")
    stored = parser.add_argument("--interventions", default=None, metavar="FILE",
                        help="stored interventions JSON (default: interventions.json or study.json in the model "
                             "folder); `vlens study --out DIR` measures one: DIR/study.json")
    mark_input_paths(parser, stored.dest)
    parser.add_argument("--threads", type=arg_int(min=1), default=1,
                        help="torch CPU threads (default 1: the tiny models gain nothing from more and run several "
                             "times faster with 1 on a busy machine; raise it for a large model on CPU)")
    parser.set_defaults(func=run_demo_cli)


def run_demo_cli(args: argparse.Namespace) -> int:
    from vlens.demo.findings import findings_lines
    from vlens.demo.pipeline import run_demo

    prepare_out(args, REPORT_FILE, RESULTS_FILE)
    outcome = run_demo(args.model, args.out, quick=args.quick, interventions_file=args.interventions,
                       progress=not args.quiet, threads=args.threads, load_options=model_options(args))
    # what a stopwatch reads: the stages and, before them, Python's start-up and the imports
    wall = seconds_since_process_start()
    stages = float(outcome.timings["total"])
    document = json.loads(outcome.results_path.read_text(encoding="utf-8"))
    document["wall_s"] = {"since_the_command_started": round(wall, 3), "stages": stages,
                          "before_the_stages": round(max(wall - stages, 0.0), 3)}
    outcome.results_path.write_text(json.dumps(document, indent=1, allow_nan=False) + "\n", encoding="utf-8")
    logger.info("wrote %s and %s in %.1f s since the command started (stages %.1f s, CPU %.1f s; Python start-up "
                "and imports %.1f s)", outcome.report_path, outcome.results_path, wall, stages,
                sum(outcome.cpu.values()), max(wall - stages, 0.0))
    for section in outcome.sections:
        if section.status != "ok":
            logger.info("  skipped: %s", section.title)
    for section in outcome.sections:
        if section.key == "findings":  # the verdicts in the terminal, not only in report.html
            echo("\n".join(findings_lines(section)))
    return 0

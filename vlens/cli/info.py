"""`vlens info`: load a model (the embedded one by default) and print its config and hook points."""

from __future__ import annotations

import argparse

from vlens.cli.console import echo
from vlens.cli.options import add_model_options, load_model_from_args

SHOWN_HOOKS = 12


def configure(parser: argparse.ArgumentParser) -> None:
    add_model_options(parser)
    parser.add_argument("--hooks", action="store_true", help=f"print every hook name (default: the first {SHOWN_HOOKS})")
    parser.set_defaults(func=run_info)


def run_info(args: argparse.Namespace) -> int:
    model = load_model_from_args(args)
    echo(model.summary())
    for key, value in model.cfg.to_dict().items():
        echo(f"  {key}: {value}")
    names = list(model.hook_dict)
    echo(f"{len(names)} hook points" + ("" if args.hooks else " (use --hooks to list them all)"))
    for name in names if args.hooks else names[:SHOWN_HOOKS]:
        echo(f"  {name}")
    return 0

"""`vlens info`: load a model (the embedded one by default) and print its config and hook points;
`vlens info --families` lists the model families vlens can convert (no model is loaded)."""

from __future__ import annotations

import argparse

from vlens.cli.console import echo
from vlens.cli.options import add_model_options, load_model_from_args

SHOWN_HOOKS = 12


def configure(parser: argparse.ArgumentParser) -> None:
    add_model_options(parser)
    parser.add_argument("--hooks", action="store_true", help=f"print every hook name (default: the first {SHOWN_HOOKS})")
    parser.add_argument("--families", action="store_true",
                        help="list the registered model families (built-in and plugins) and the HF classes each "
                        "converts, without loading a model")
    parser.set_defaults(func=run_info, needs_model=lambda args: not args.families)


def family_lines() -> list[str]:
    """One line per registered family: its name, the HF classes it converts and where its adapter lives."""
    from vlens.core.architectures import registered_adapters

    return [f"  {family}: {', '.join(adapter.hf_class_names)} ({adapter.__module__})"
            for family, adapter in registered_adapters().items()]


def run_info(args: argparse.Namespace) -> int:
    if args.families:
        lines = family_lines()
        echo(f"{len(lines)} model families:")
        for line in lines:
            echo(line)
        return 0
    model = load_model_from_args(args)
    echo(model.summary())
    for key, value in model.cfg.to_dict().items():
        echo(f"  {key}: {value}")
    names = list(model.hook_dict)
    echo(f"{len(names)} hook points" + ("" if args.hooks else " (use --hooks to list them all)"))
    for name in names if args.hooks else names[:SHOWN_HOOKS]:
        echo(f"  {name}")
    from vlens.core.architectures import registered_adapters

    echo(f"model families vlens converts: {', '.join(registered_adapters())} (vlens info --families for their "
         "HF classes)")
    return 0

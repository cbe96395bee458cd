"""The `vlens` command line.

Each feature owns its sub-commands in its own module, exposing ``add_cli(subparsers)``;
this file only lists those modules. Adding a command is one line in ``COMMAND_MODULES``.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# module path -> provides add_cli(subparsers) registering one or more sub-commands
COMMAND_MODULES: list[str] = [
    "vlens.info_cli",
    "vlens.data.cli",
    "vlens.evaluation.cli",
    "vlens.recipes.embedded.cli",
    "vlens.lens.cli",
    "vlens.ablation.cli",
    "vlens.patching.cli",
    "vlens.lens.logit_lens_cli",
    "vlens.demo.cli",
    "vlens.training.cli",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vlens",
        description="Mechanistic interpretability for vision-language models.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module_name in COMMAND_MODULES:
        importlib.import_module(module_name).add_cli(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 1
    result = args.func(args)
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())

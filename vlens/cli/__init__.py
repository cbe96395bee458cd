"""The `vlens` command line (also `python -m vlens`).

`COMMANDS` is a static table: each command's name, its one-line help and the module that builds
its parser. `vlens --help` lists the table without importing any command; a command's module is
imported only when that command is used. Adding a command is one line here plus a module whose
``configure(parser)`` adds the command's arguments and sets ``func`` (``module:function`` names
another function than ``configure``). The command modules live here, in the entry-point layer
(the embedded-model recipe keeps its own: `vlens.recipes.embedded.cli`); they import only the
standard library and light vlens modules at top level; torch, numpy and the methods are
imported inside their run functions, so every ``vlens ... --help`` is fast. The options every
command shares are in `vlens.cli.options`; logging, ``--quiet``/``-v`` and the one-line user
errors in `vlens.cli.console`.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from typing import NamedTuple, NoReturn

from vlens.cli.help_text import RawDescriptionOptionsHelpFormatter, use_options_help


class Command(NamedTuple):
    name: str
    target: str  # "package.module" (its configure) or "package.module:function"
    help: str


COMMANDS: tuple[Command, ...] = (
    Command("info", "vlens.cli.info", "show a model's config and hook points"),
    Command("verify", "vlens.cli.verify", "check that vlens is exact on a checkpoint (logits, generate, hooks, edits)"),
    Command("data", "vlens.cli.data", "generate synthetic datasets (imagefolders)"),
    Command("eval", "vlens.cli.eval", "evaluate a model on a local counting or multiple-choice set"),
    Command("patch", "vlens.cli.patch", "activation patching sweeps (layer x region/position/head) and AtP"),
    Command("circuit", "vlens.cli.circuit", "edge attribution (EAP, EAP-IG) and a circuit with exact faithfulness"),
    Command("logit-lens", "vlens.cli.logit_lens", "the logit lens per layer at the final prompt position"),
    Command("lens", "vlens.cli.lens:configure_lens", "train lenses (per-layer translators)"),
    Command("headlens", "vlens.cli.lens:configure_headlens", "HeadLens: decode every head, score and classify it"),
    Command("ablate", "vlens.cli.ablate", "ablate every head per task, rank heads, Jaccard overlap across tasks"),
    Command("knockout", "vlens.cli.knockout", "attention knockout of edges (image->final, ...) over layer windows"),
    Command("routing", "vlens.cli.routing", "mixture-of-experts routing by token region (image vs text experts)"),
    Command("train", "vlens.cli.train:configure_train", "LoRA fine-tuning with the object-focused attention loss"),
    Command("study", "vlens.cli.study", "studies: the +SFT / +L_focus / +temperature table; object-tokens; flow"),
    Command("temperature", "vlens.cli.temperature", "adaptive head temperature: fit, apply, export"),
    Command("steer", "vlens.cli.steer", "steer generation with a direction (mean difference, SAE feature, probe)"),
    Command("attribute-generation", "vlens.cli.attribute_generation",
            "which image tokens each generated token used (maps per token, exact patching, logit lens)"),
    Command("sae", "vlens.cli.sae", "sparse autoencoders: train on a hook's activations, feature dashboard"),
    Command("transcoder", "vlens.cli.transcoder", "transcoders replacing the MLPs: train, evaluate (loss recovered)"),
    Command("graph", "vlens.cli.graph", "the attribution graph of an answer: features, image regions, error nodes"),
    Command("tiny", "vlens.cli.tiny", "write a family's tiny random model as a model folder (offline, for tests)"),
    Command("demo", "vlens.cli.demo", "the counting-circuit study end to end, as one HTML report"),
    Command("zoo", "vlens.recipes.embedded.cli", "the embedded tiny model: train (reproduce) or evaluate it"),
)

# old spellings: a clear pointer to the new name instead of argparse's bare "unrecognized arguments"
RENAMED_FLAGS = {
    "--size": "--image-size",
    "--no-progress": "--quiet",
    "--html": "--out DIR (figures are written into the --out folder)",
    "--markdown": "--out DIR (the Markdown summary is written into the --out folder)",
}

EPILOG = """\
Every command: --quiet (no progress bars or status lines), -v/--verbose (debug logging),
--help. Commands that load a model: --model (default tiny, the embedded model), --device,
--dtype, --image-size / --min-pixels / --max-pixels. --out is always a folder: results.json
and figures are written inside it. Errors in what you asked for are one line and exit 2.
Run `vlens COMMAND --help` for a command's options; docs/ in the repository has the methods."""


# argparse's own messages about which arguments exist (not about a value the user gave)
ARGPARSE_USAGE_PHRASES = ("arguments are required", "unrecognized arguments", "invalid choice", "expected one argument",
                          "ambiguous option", "not allowed with argument", "is required")


class OneLineParser(argparse.ArgumentParser):
    """argparse that reports a usage error in one line (no usage block above it): what was wrong,
    and where the options are listed. Sub-command parsers inherit the class."""

    def error(self, message: str) -> NoReturn:
        from vlens.cli.console import print_error  # already imported: build_parser added the output flags

        if any(phrase in message for phrase in ARGPARSE_USAGE_PHRASES):  # which flags exist: point to them
            message += f" (`{self.prog} --help` lists the options)"
        print_error(self.prog, message)
        self.exit(2)


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The `vlens` parser. With `argv`, only the command it names is built (the others are listed
    from the table); without, every command is built (tests and documentation walk it)."""
    from vlens import __version__
    from vlens.cli.console import add_output_flags

    parser = OneLineParser(
        prog="vlens", description="Mechanistic interpretability for vision-language models.",
        epilog=EPILOG, formatter_class=RawDescriptionOptionsHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"vlens {__version__}")
    add_output_flags(parser, top_level=True)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", title="commands")
    wanted = None if argv is None else _command_name(argv)
    known = wanted in {command.name for command in COMMANDS}
    for command in COMMANDS:
        if known and command.name != wanted:
            continue  # `vlens CMD ...` parses CMD's arguments only: the other parsers are not needed
        sub = commands.add_parser(command.name, help=command.help, description=_sentence(command.help))
        if wanted is None or wanted == command.name:
            _configure(command, sub)
    return parser


def _command_name(argv: Sequence[str]) -> str | None:
    """The first argument that is not an option (the top level has only flags without values)."""
    return next((arg for arg in argv if not arg.startswith("-")), None)


def _sentence(text: str) -> str:
    return text[:1].upper() + text[1:] + "."


def _configure(command: Command, parser: argparse.ArgumentParser) -> None:
    from vlens.cli.console import add_output_flags

    module_name, _, function = command.target.partition(":")
    getattr(importlib.import_module(module_name), function or "configure")(parser)
    for leaf in _leaves(parser):
        add_output_flags(leaf)
        leaf.set_defaults(command_prog=leaf.prog)
    use_options_help(parser)


def _leaves(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """The parsers that run something: `parser` itself, or the leaves under its sub-commands."""
    groups = [action for action in parser._actions if isinstance(action, argparse._SubParsersAction)]
    if not groups:
        return [parser]
    children = {id(p): p for group in groups for p in group.choices.values()}  # aliases share a parser
    return [leaf for child in children.values() for leaf in _leaves(child)]


def _check_renamed(parser: argparse.ArgumentParser, argv: Sequence[str]) -> None:
    for arg in argv:
        if arg == "--":
            break
        new = RENAMED_FLAGS.get(arg.split("=", 1)[0])
        if new:
            parser.error(f"{arg.split('=', 1)[0]} is now {new}")


def main(argv: Sequence[str] | None = None) -> int:
    """Run `vlens ARGV`; returns the exit status (2: an error in what was asked, 1: a bug in vlens).

    Nothing raises out of here but SystemExit (argparse's own usage errors, exit 2): a failure
    while the parser is built or the arguments are read is one line too (`vlens.cli.console`)."""
    from vlens.cli.early_checks import missing_input

    argv = list(sys.argv[1:] if argv is None else argv)
    missing = missing_input(argv)  # before anything heavier is imported (vlens.cli.early_checks)
    if missing is not None:
        sys.stderr.write(f"{missing[0]}: error: {missing[1]}\n")  # print_error's line, without importing it
        return 2
    from vlens.cli.console import report_failure, run_command

    try:
        parser = build_parser(argv)
        _check_renamed(parser, argv)
        args = parser.parse_args(argv)
    except (Exception, KeyboardInterrupt) as error:  # e.g. an unreadable --device-map JSON file
        command = _command_name(argv)
        prog = f"vlens {command}" if command in {c.name for c in COMMANDS} else "vlens"
        return report_failure(prog, error, any(arg in ("-v", "--verbose") for arg in argv))
    if getattr(args, "func", None) is None:
        parser.print_help(sys.stderr)
        return 2
    from vlens.utils.provenance import run_context

    with run_context(argv, command=" ".join(getattr(args, "command_prog", "vlens").split()[1:]) or None):
        return run_command(args)


__all__ = ["COMMANDS", "Command", "build_parser", "main"]

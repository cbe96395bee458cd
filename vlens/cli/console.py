"""How `vlens` talks: logging configured once per command, --quiet / -v, user errors as one line.

Status lines go through `logging` (each module's ``logging.getLogger(__name__)``) to stderr:
INFO by default, DEBUG with ``-v``, WARNING with ``--quiet`` (which also hides every progress
bar: commands pass ``progress=not args.quiet`` down). What a command is asked to print (tables,
summaries, JSON) goes to stdout. With ``--quiet`` Hugging Face's own bars (loading or writing
weights) are hidden too. Every failure is one line (`vlens.cli.failures`): what the user can
cause or fix (`UserInputError`, a missing or unreadable file, a full disk, a broken model folder,
out of memory, ...) prints ``vlens <command>: error: <message>`` and exits 2; anything else is
reported as a bug in one line and exits 1. ``-v`` adds the traceback; without it none is printed.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import logging
import os
import sys
import traceback
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext
from pathlib import Path

from vlens.utils.errors import UserInputError
from vlens.utils.finite import NON_FINITE_EXIT

HF_BARS_VARIABLE = "HF_HUB_DISABLE_PROGRESS_BARS"
BROKEN_PIPE_STATUS = 141  # 128 + SIGPIPE, as a shell reports a reader that stopped early
# what a user can cause and fix: the command line says it in one line and exits 2 (vlens.cli.failures
# maps many more exceptions the same way; this tuple is for code that catches them itself)
USER_ERRORS: tuple[type[BaseException], ...] = (UserInputError, OSError, MemoryError)


def add_output_flags(parser: argparse.ArgumentParser, top_level: bool = False) -> None:
    """--quiet and -v/--verbose; below the top level they only override what was given there."""
    default = {"quiet": False, "verbose": 0} if top_level else {"quiet": argparse.SUPPRESS,
                                                                "verbose": argparse.SUPPRESS}
    group = parser.add_argument_group("output")
    group.add_argument("-q", "--quiet", action="store_true", default=default["quiet"],
                       help="no progress bars or status lines (warnings and errors only)")
    group.add_argument("-v", "--verbose", action="count", default=default["verbose"],
                       help="debug logging; with an error in the input, also its traceback")


class _StderrHandler(logging.Handler):
    """Writes to whatever sys.stderr is when a record arrives (pytest swaps it per test)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            sys.stderr.write(self.format(record) + "\n")
            sys.stderr.flush()
        except Exception:  # logging must never break the command
            self.handleError(record)


class _Formatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        if record.exc_info:
            message += "\n" + self.formatException(record.exc_info)
        if record.levelno == logging.INFO:
            return message
        if record.levelno < logging.INFO:
            return f"debug [{record.name}]: {message}"
        return f"{record.levelname.lower()}: {message}"


@contextmanager
def command_logging(verbose: int = 0, quiet: bool = False) -> Iterator[None]:
    """Route the `vlens` loggers to stderr for one command; restores the previous state after."""
    logger = logging.getLogger("vlens")
    saved = (logger.level, logger.propagate)
    handler = _StderrHandler()
    handler.setFormatter(_Formatter())
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG if verbose else logging.WARNING if quiet else logging.INFO)
    logger.propagate = False  # one line per message, even where the root logger has handlers
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(saved[0])
        logger.propagate = saved[1]


@contextmanager
def hf_bars_hidden() -> Iterator[None]:
    """Hide Hugging Face's own bars (loading and writing weights, downloads) for one command."""
    if "transformers" in sys.modules:
        from vlens.zoo.specs import hf_progress_bars

        with hf_progress_bars(False):
            yield
        return
    # not imported yet: the variable is read when huggingface_hub is imported (importing it here
    # would cost every command, even those that never load a model)
    saved = os.environ.get(HF_BARS_VARIABLE)
    os.environ[HF_BARS_VARIABLE] = "1"
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(HF_BARS_VARIABLE, None)
        else:
            os.environ[HF_BARS_VARIABLE] = saved


def echo(text: object = "") -> None:
    """Print what the command was asked for (a table, a summary, JSON) on stdout: every command
    prints its results through here; status lines are logged (stderr), never printed."""
    print(text)


def print_error(prog: str, message: str) -> None:
    """``<prog>: error: <message>`` on stderr: how a command reports a failure, in one line."""
    print(f"{prog}: error: {message}", file=sys.stderr, flush=True)


def non_finite_exit(messages: Sequence[str], allow_nan: bool, prog: str) -> int:
    """Exit status of a command after its results are written: `NON_FINITE_EXIT` if non-finite
    values were reported (`vlens.utils.finite.collect_non_finite`) and not allowed, else 0. Says which
    on stderr."""
    if not messages:
        return 0
    if allow_nan:
        print(f"{prog}: {len(messages)} non-finite warning(s); the affected results are null (--allow-nan)",
              file=sys.stderr)
        return 0
    print_error(prog, f"activations or logits were NaN/inf ({len(messages)} warning(s) above); the results were "
                "written with null in their place. Check the model's weights and inputs, or pass --allow-nan to "
                "accept such results.")
    return NON_FINITE_EXIT


def one_line(error: BaseException) -> str:
    """The error's message on one line (OSErrors as 'reason: path')."""
    if isinstance(error, OSError) and error.strerror and error.filename:
        text = f"{error.strerror}: {error.filename}"
    else:
        text = str(error) or type(error).__name__
    return " ".join(text.split())


def report_failure(prog: str, error: BaseException, verbose: int | bool = 0) -> int:
    """Say `error` in one line (`vlens.cli.failures.explain`), the traceback first with -v; return the
    exit status (2: the input or the machine, 1: a bug, 130: interrupted)."""
    if isinstance(error, BrokenPipeError) and error.filename is None:  # `vlens ... | head`: the reader left
        with contextlib.suppress(OSError, ValueError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
        return BROKEN_PIPE_STATUS
    from vlens.cli.failures import INTERRUPTED_STATUS, explain  # on failure only: a command starts lighter

    failure = explain(error)
    if failure.status == INTERRUPTED_STATUS:
        print(f"{prog}: interrupted", file=sys.stderr, flush=True)
        return failure.status
    if verbose:
        traceback.print_exception(type(error), error, error.__traceback__, file=sys.stderr)
    print_error(prog, failure.message)
    return failure.status


def run_command(args: argparse.Namespace) -> int:
    """Call ``args.func(args)`` with logging set up; every failure -> one line on stderr
    (`report_failure`): exit 2 for what the user can fix, 1 for a bug.

    Before the command runs, the values that depend on each other or on the machine are checked
    (`vlens.cli.options.check_args`), so a bad combination fails before any model loads.
    Under torchrun (`vlens.parallel`): ``args.sharding`` is the run's `Sharding`; only rank 0
    shows progress, status lines, printed summaries and warnings (other ranks keep only errors and
    warnings about NaN in their own examples); a failure on any rank exits 1 on every
    rank with one line saying what happened.
    """
    out = getattr(args, "out", None)
    fresh_out = Path(out) if isinstance(out, (str, os.PathLike)) and not Path(out).exists() else None
    status = _run_checked(args)
    if status != 0 and fresh_out is not None and fresh_out.is_dir():
        try:  # a command that failed early leaves no empty --out folder behind (a non-empty one stays)
            fresh_out.rmdir()
        except OSError:
            pass
    return status


def _run_checked(args: argparse.Namespace) -> int:
    from vlens.cli.options import check_args

    prog = getattr(args, "command_prog", "vlens")
    verbose = getattr(args, "verbose", 0)
    try:  # before torch is imported (vlens.parallel imports it): a bad flag or path fails at once
        check_args(args)
    except (Exception, KeyboardInterrupt) as error:
        return report_failure(prog, error, verbose)
    from vlens.parallel.command import CommandExit, done, run_settings, run_store, sharded_command
    from vlens.parallel.quiet import other_ranks_quiet
    from vlens.utils.provenance import note_run, seeds_of

    try:
        with sharded_command(prog, getattr(args, "shardable", False)) as sharding:
            args.sharding = sharding
            note_run(seeds_of(vars(args)), world_size=sharding.world_size)  # for the results' provenance
            if getattr(args, "shardable", False) and getattr(args, "out", None) is not None:
                sharding.store = run_store(args.out, run_settings(args), getattr(args, "overwrite", False))
            if not sharding.is_main:
                args.quiet = True  # progress and status lines once, from rank 0
            # other ranks: no printed summaries, and each warning once, from rank 0 (vlens.parallel.quiet)
            with contextlib.redirect_stdout(io.StringIO()) if not sharding.is_main else nullcontext(), \
                    other_ranks_quiet(sharding):
                status, finished = _run(args, prog)
            if finished and status in (0, NON_FINITE_EXIT):
                done(sharding)  # the output is written: the finished units are no longer needed
            # otherwise (a user error, Ctrl-C, a bug) the finished units stay for --resume
            return status
    except CommandExit as stop:
        print_error(prog, stop.message)
        return 1
    except (Exception, KeyboardInterrupt) as error:  # before the command started (e.g. under torchrun)
        return report_failure(prog, error, verbose)


def _run(args: argparse.Namespace, prog: str) -> tuple[int, bool]:
    """(exit status, whether the command returned: its output is written)."""
    with command_logging(args.verbose, args.quiet), hf_bars_hidden() if args.quiet else nullcontext():
        try:
            return int(args.func(args) or 0), True
        except FloatingPointError as error:  # NaN/inf activations or loss (vlens.utils.finite): exit 3, like --allow-nan's
            if args.verbose:
                traceback.print_exc()
            print_error(prog, one_line(error))
            return NON_FINITE_EXIT, False
        except (Exception, KeyboardInterrupt) as error:
            return report_failure(prog, error, args.verbose), False


__all__ = ["USER_ERRORS", "add_output_flags", "command_logging", "echo", "non_finite_exit", "one_line",
           "print_error", "report_failure", "run_command"]

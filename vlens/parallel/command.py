"""One command's life under torchrun: join the group, keep finished units in --out, fail cleanly.

    with sharded_command("vlens patch", shardable=True) as sharding:
        sharding.store = run_store(out, run_settings(args))  # finished units, for a resume
        ...  # the command, passing `sharding` to the method; only sharding.is_main writes
        done(sharding)  # after the output is written

A command that does not split its work refuses to run on more than one process (N copies
would all write the same output). A `DistributedRunError` becomes one line on stderr and
exit status 1 on every process; the resume folder is kept. After the main process wrote the
output, `done(sharding)` removes the resume folder.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from vlens.parallel.launch import from_env, stop_on_sigterm
from vlens.parallel.sharding import DistributedRunError, Sharding
from vlens.parallel.store import UnitStore, plain_settings
from vlens.utils.errors import UserInputError

STORE_FOLDER = ".vlens-shards"  # inside --out: finished work units of an unfinished run
# arguments that change no number of the results (where and how they are written or shown)
NOT_SETTINGS = frozenset({"out", "overwrite", "quiet", "verbose", "func", "command_prog", "sharding", "html",
                          "markdown", "no_progress", "metric", "allow_nan"})


class CommandExit(SystemExit):
    """A sharded command failed on some process: exit status 1; `message` says why (the command
    line prints it: `vlens.cli.console.run_command`)."""

    def __init__(self, message: str):
        super().__init__(1)
        self.message = message


def run_settings(args: argparse.Namespace | Mapping[str, Any]) -> dict[str, Any]:
    """What a resumed run must share with the run that wrote the finished units: the arguments that
    change results (not --out, --overwrite, --quiet, ...)."""
    items = vars(args) if isinstance(args, argparse.Namespace) else dict(args)
    return plain_settings({k: v for k, v in items.items() if k not in NOT_SETTINGS and not callable(v)})


def run_store(out: str | Path, settings: Mapping[str, Any], overwrite: bool = False) -> UnitStore:
    """The store of finished units in OUT/.vlens-shards (created when the first unit finishes).

    A store left by a run with other settings is an error, or, with `overwrite`, replaced.
    """
    return UnitStore(Path(out) / STORE_FOLDER, settings, replace_other=overwrite)


def done(sharding: Sharding) -> None:
    """After the output is written: the main process deletes the resume folder."""
    if sharding.store is not None and sharding.is_main:
        sharding.store.remove()


@contextmanager
def sharded_command(name: str, shardable: bool) -> Iterator[Sharding]:
    """The command's `Sharding` (from torchrun's environment; one process without torchrun)."""
    sharding = from_env()
    try:
        if sharding.distributed and not shardable:
            raise UserInputError(f"{name} does not split its work across processes; run it without torchrun "
                                 "(or with --nproc-per-node 1)")
        with stop_on_sigterm(sharding):
            yield sharding
    except DistributedRunError as error:  # the process group may be broken: exit without leaving it
        raise CommandExit(str(error)) from error


__all__ = ["STORE_FOLDER", "CommandExit", "done", "run_settings", "run_store", "sharded_command"]

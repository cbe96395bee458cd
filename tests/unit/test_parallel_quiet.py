"""Under torchrun a warning appears once: ranks other than 0 drop warnings and log records below ERROR
(`vlens.parallel.quiet.other_ranks_quiet`, applied to every command by `vlens.cli.console.run_command`),
but keep errors and NaN warnings about their own examples."""

from __future__ import annotations

import argparse
import logging
import warnings

import pytest

import vlens.parallel.command
from vlens.cli.console import run_command
from vlens.parallel import Sharding
from vlens.parallel.quiet import other_ranks_quiet
from vlens.utils.finite import NonFiniteWarning, warn_non_finite

logger = logging.getLogger("vlens.test_quiet")


def emit() -> None:
    warnings.warn("the config has an odd field", UserWarning, stacklevel=1)
    warn_non_finite("logit lens", "2 of 5 examples")
    logger.warning("status warning")
    logger.error("a real error")


def test_rank_one_keeps_only_errors_and_its_own_nan_warnings(caplog):
    caplog.set_level(logging.DEBUG)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with other_ranks_quiet(Sharding(rank=1, world_size=2)):  # its filters replace "always" inside
            emit()
    assert [type(w.message) for w in caught] == [NonFiniteWarning]
    assert [r.getMessage() for r in caplog.records] == ["a real error"]
    # after the block: everything shows again
    caplog.clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        emit()
    assert [type(w.message) for w in caught] == [UserWarning, NonFiniteWarning]
    assert [r.getMessage() for r in caplog.records] == ["status warning", "a real error"]


@pytest.mark.parametrize("sharding", [Sharding(), Sharding(rank=0, world_size=2)])
def test_rank_zero_and_single_process_runs_keep_every_warning(sharding, caplog):
    caplog.set_level(logging.DEBUG)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with other_ranks_quiet(sharding):
            emit()
    assert [type(w.message) for w in caught] == [UserWarning, NonFiniteWarning]
    assert [r.getMessage() for r in caplog.records] == ["status warning", "a real error"]


def test_run_command_quiets_a_non_zero_rank(monkeypatch, capsys):
    """The command dispatcher applies it: a command on rank 1 of 2 prints no warning; rank 0 does."""
    import contextlib

    def command(args):
        warnings.warn("model warning", UserWarning, stacklevel=1)
        logging.getLogger("vlens.cli.fake").warning("status warning")
        return 0

    for rank in (1, 0):
        @contextlib.contextmanager
        def sharded(prog, shardable, rank=rank):
            yield Sharding(rank=rank, world_size=2)

        monkeypatch.setattr(vlens.parallel.command, "sharded_command", sharded)
        args = argparse.Namespace(func=command, verbose=0, quiet=False, command_prog="vlens fake")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert run_command(args) == 0
        err = capsys.readouterr().err
        if rank == 1:
            assert not caught and "status warning" not in err
        else:
            assert [str(w.message) for w in caught] == ["model warning"] and "warning: status warning" in err

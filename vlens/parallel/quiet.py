"""Warnings once per run, not once per process: ranks other than 0 keep quiet.

Under torchrun every process loads the same model and runs the same code, so a warning about
the model, the settings or a library (a transformers config note, a deprecation, a vlens
`logger.warning`) would appear world_size times. On ranks other than 0, `other_ranks_quiet`
drops Python warnings and log records below ERROR (of every logger: vlens, transformers, ...)
for the duration of the command. What stays: errors, and `vlens.utils.finite.NonFiniteWarning`,
which is about the rank's own work units (NaN activations in the examples it ran) and would
otherwise be lost.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

from vlens.parallel.sharding import Sharding
from vlens.utils.finite import NonFiniteWarning


@contextmanager
def other_ranks_quiet(sharding: Sharding) -> Iterator[None]:
    """On a rank other than 0: no warnings (but `NonFiniteWarning`) and no log records below ERROR
    inside the block; on rank 0 (and without torchrun) nothing changes."""
    if sharding.is_main:
        yield
        return
    previous = logging.root.manager.disable
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        warnings.simplefilter("default", NonFiniteWarning)  # the rank's own examples: not a duplicate
        logging.disable(logging.WARNING)  # WARNING and below, every logger; ERROR still shows
        try:
            yield
        finally:
            logging.disable(previous)


__all__ = ["other_ranks_quiet"]

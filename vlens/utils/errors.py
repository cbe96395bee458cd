"""The one exception for mistakes in what a user asked for, and where a failure happened.

Raise `UserInputError` when the input, not the code, is wrong: a value out of its range, an
option that does not apply, a model folder that does not exist. The message is one line that
names the argument, says what was wrong and how to fix it. It subclasses `ValueError`, so
callers that already catch `ValueError` keep working; the `vlens` command prints it as
``vlens <command>: error: <message>`` and exits with status 2, without a traceback.

`failure_context("loading the model ./m")` marks what was being done when an exception from a
library (transformers, safetensors, accelerate, ...) passes through: the command line then says
that, and counts the failure as the user's input (exit 2) rather than as a bug in vlens (exit 1).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

CONTEXT_ATTRIBUTE = "vlens_context"


class UserInputError(ValueError):
    """Bad input from the user; the message says what was wrong and how to fix it."""


@contextmanager
def failure_context(what: str, fix: str = "") -> Iterator[None]:
    """Label exceptions raised inside the block with `what` was being done (e.g. "loading the model
    folder ./m") and how to fix it; the innermost label wins. Nothing is caught."""
    try:
        yield
    except BaseException as error:
        if getattr(error, CONTEXT_ATTRIBUTE, None) is None:
            try:
                setattr(error, CONTEXT_ATTRIBUTE, (what, fix))
            except AttributeError:  # an exception type with __slots__: left unlabelled
                pass
        raise


def error_context(error: BaseException) -> tuple[str, str] | None:
    """(what was being done, how to fix it) from `failure_context`, or None."""
    context = getattr(error, CONTEXT_ATTRIBUTE, None)
    return context if isinstance(context, tuple) else None


__all__ = ["UserInputError", "error_context", "failure_context"]

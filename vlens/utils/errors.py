"""The one exception for mistakes in what a user asked for.

Raise `UserInputError` when the input, not the code, is wrong: a value out of its range, an
option that does not apply, a model folder that does not exist. The message is one line that
names the argument, says what was wrong and how to fix it. It subclasses `ValueError`, so
callers that already catch `ValueError` keep working; the `vlens` command prints it as
``vlens <command>: error: <message>`` and exits with status 2, without a traceback.
"""

from __future__ import annotations


class UserInputError(ValueError):
    """Bad input from the user; the message says what was wrong and how to fix it."""


__all__ = ["UserInputError"]

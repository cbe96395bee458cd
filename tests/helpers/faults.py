"""Running a `vlens` command in-process and reading its one-line user error."""

from __future__ import annotations

from vlens.utils.errors import UserInputError


def run_cli(argv: list[str], capsys) -> tuple[int, str]:
    """(exit status, stderr + error text) of `vlens argv`; a UserInputError that escapes the
    dispatcher counts as status 2 with its message (what the command line prints)."""
    from vlens.cli import main

    try:
        code = main(argv)
        message = ""
    except UserInputError as err:
        code, message = 2, str(err)
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else 2
        message = "" if isinstance(exit_.code, int) else str(exit_.code)
    captured = capsys.readouterr()
    return int(code or 0), captured.err + message

"""Input paths checked before anything else is imported: a misspelt ``--data`` fails at once.

`vlens.cli.main` calls `missing_input(argv)` before it builds a parser. Building one imports the
command's module and the shared options (logging, the failure boundary, ...), which costs about
as much as the interpreter's own start-up; a path that does not exist is known from the command
line alone. `INPUT_FLAGS` lists, per command, the flags whose values must be existing files or
folders (the same flags `vlens.cli.dataset_options.mark_input_paths` marks on the parsers, which
`check_input_paths` checks again after parsing; a test keeps the two equal). Only the standard
library's ``os`` is used here. What this does not see (an abbreviated flag, ``--data=x`` after
``--``) the full check after parsing still refuses, with the same line.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

# command -> {flag: takes several values}
INPUT_FLAGS: dict[str, dict[str, bool]] = {
    "patch": {"--pairs": False, "--image-dir": False},
    "circuit": {"--pairs": False, "--image-dir": False},
    "logit-lens": {"--data": False, "--image-dir": False},
    "lens": {"--data": False, "--image-dir": False},
    "headlens": {"--data": False, "--image-dir": False, "--lens": False, "--lens-data": False},
    "ablate": {"--data": True, "--image-dir": False, "--patching": False},
    "routing": {"--data": False, "--image-dir": False},
    "train": {"--data": True, "--image-dir": False},
    "eval": {"--data": False, "--image-dir": False},
    "temperature": {"--data": False, "--image-dir": False, "--temps": False, "--result": False, "--taxonomy": False},
    "sae": {"--data": False, "--image-dir": False, "--sae": False},
    "demo": {"--interventions": False},
    "steer": {"--image": False, "--direction": False, "--sae": False},
    "info": {"--image": False},
    "knockout": {"--data": False, "--image-dir": False},
    "graph": {"--transcoders": False, "--image": False, "--examples-data": False, "--image-dir": False},
    "transcoder": {"--data": False, "--image-dir": False, "--transcoders": False},
    "attribute-generation": {"--image": False, "--baseline-image": False},
}


def missing_message(flag: str, path: str) -> str:
    """The one line for an input path that does not exist (also `check_input_paths`'s)."""
    return (f"{flag} {path}: no such file or folder (check the path; relative paths start from "
            f"{os.getcwd()})")


def missing_input(argv: Sequence[str]) -> tuple[str, str] | None:
    """(prog, message) for the first input path in `argv` that does not exist, else None.

    prog is ``vlens`` and the command words before the first flag (``vlens temperature apply``)."""
    if any(arg in ("-h", "--help", "--version") for arg in argv):
        return None  # help is shown whatever the other arguments say
    words = [arg for arg in argv if not arg.startswith("-")]
    command = words[0] if words else None
    flags = INPUT_FLAGS.get(command or "")
    if not flags:
        return None
    start = argv.index(command)
    end = next((i for i in range(start, len(argv)) if argv[i].startswith("-")), len(argv))
    prog = " ".join(["vlens", *argv[start:end]])
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            break
        flag, eq, inline = arg.partition("=")
        several = flags.get(flag)
        if several is None:
            i += 1
            continue
        values = [inline] if eq else []
        j = i + 1
        if not eq:
            while j < len(argv) and not argv[j].startswith("-") and (several or not values):
                values.append(argv[j])
                j += 1
        for value in values:
            if value.strip() and not os.path.exists(os.path.expanduser(value)):
                return prog, missing_message(flag, value)
        i = j
    return None


__all__ = ["INPUT_FLAGS", "missing_input", "missing_message"]

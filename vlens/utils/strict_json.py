"""JSON read strictly: a key given twice in one object is an error naming the file and line.

Python's `json` keeps the last of two equal keys without a word (``{"answer": "3", "answer": "4"}``
is read as "4"), so a hand-edited dataset row or config would silently mean something else.
`loads_strict` refuses it, naming the key and, where it can tell, the line of the second one.
"""

from __future__ import annotations

import json
import re
from typing import Any

from vlens.utils.errors import UserInputError


class DuplicateKeyError(UserInputError):
    """A JSON object holds the same key twice; the message names the file, line and key."""


class _Duplicate(Exception):
    def __init__(self, key: str):
        super().__init__(key)
        self.key = key


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise _Duplicate(key)
        result[key] = value
    return result


def duplicate_line(text: str, key: str, first_line: int = 1) -> int | None:
    """The line (counting from `first_line`) of the second ``"key":`` in `text`, if it can be found."""
    pattern = re.compile(re.escape(json.dumps(key)) + r"\s*:")
    found = [match.start() for match in pattern.finditer(text)]
    if len(found) < 2:
        return None
    return first_line + text.count("\n", 0, found[1])


def loads_strict(text: str, where: str, first_line: int = 1) -> Any:
    """`json.loads(text)`, but a repeated key raises `DuplicateKeyError` naming `where` (a file, or
    "file line N" for one JSON-lines row) and the line of the repeat. `json.JSONDecodeError`s pass through."""
    try:
        return json.loads(text, object_pairs_hook=_no_duplicates)
    except _Duplicate as duplicate:
        line = duplicate_line(text, duplicate.key, first_line)
        at = f" line {line}" if line is not None and " line " not in where else ""
        raise DuplicateKeyError(
            f"{where}{at}: the key {duplicate.key!r} appears twice in one object (JSON would silently keep the "
            "last value); remove one of them") from None


__all__ = ["DuplicateKeyError", "duplicate_line", "loads_strict"]

"""Marked sections of a Markdown file: the text between `<!-- vlens:NAME -->` and `<!-- /vlens:NAME -->`,
written by one command and kept by the others that rewrite the file (the interventions study's section of a
model card, which a card re-render keeps; the README's paragraph of claims about the embedded model)."""

from __future__ import annotations

import re

from vlens.utils.errors import UserInputError

_NAME = re.compile(r"[\w-]+")
_ANY_SECTION = re.compile(r"<!-- vlens:([\w-]+) -->.*?<!-- /vlens:\1 -->", re.DOTALL)


def section_markers(name: str) -> tuple[str, str]:
    """The opening and closing markers of the section called `name` (letters, digits, `_` and `-`)."""
    if not _NAME.fullmatch(name):
        raise UserInputError(f"a marked section's name is letters, digits, '_' and '-' only, got {name!r}")
    return f"<!-- vlens:{name} -->", f"<!-- /vlens:{name} -->"


def marked_sections(text: str) -> list[str]:
    """Every marked section in `text`, markers included, in order."""
    return [match.group(0) for match in _ANY_SECTION.finditer(text)]


def replace_marked_section(text: str, name: str, body: str, *, append_if_missing: bool = True) -> str:
    """`text` with the section `name` holding `body` (on its own lines between the markers). A text without the
    section gets it appended after a blank line, or, with `append_if_missing=False`, raises an error that names
    the markers to add."""
    begin, end = section_markers(name)
    section = f"{begin}\n{body.strip(chr(10))}\n{end}"
    start = text.find(begin)
    stop = text.find(end, start + len(begin)) if start >= 0 else -1
    if start >= 0 and stop >= 0:
        return text[:start] + section + text[stop + len(end):]
    if not append_if_missing:
        raise UserInputError(f"no marked section {name!r} to replace: the file needs the lines {begin} and {end}")
    return text.rstrip("\n") + ("\n\n" if text.strip() else "") + section + "\n"


__all__ = ["marked_sections", "replace_marked_section", "section_markers"]

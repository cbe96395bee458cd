"""Word lists for head scores, mapped to token ids through a tokenizer.

A word counts through every single-token spelling the tokenizer has for it (``word``,
`` word``, ``Word``, `` Word``). A word that needs several tokens counts through its *first*
token, the one a head must promote to start the word (skipped when that piece is only
whitespace). Unknown-word ids (``<unk>``) and special tokens never count.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping

from vlens.utils.errors import UserInputError

logger = logging.getLogger(__name__)

VISUAL_WORDS: tuple[str, ...] = (
    # colours
    "red", "orange", "yellow", "green", "blue", "purple", "black", "white", "gray", "grey", "brown", "pink",
    "colour", "color", "colours", "colors", "dark", "light", "bright",
    # shapes
    "triangle", "square", "pentagon", "hexagon", "star", "circle", "round", "rectangle", "oval", "dot",
    "shape", "triangles", "squares", "pentagons", "hexagons", "stars", "circles", "dots", "shapes",
    # edges and boundaries
    "edge", "edges", "border", "boundary", "line", "lines", "corner", "corners", "outline", "contour", "side",
    # sizes
    "big", "small", "large", "tiny", "huge", "size", "tall", "short", "wide",
)
NUMBER_WORDS: tuple[str, ...] = tuple(str(i) for i in range(21)) + (
    "zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
    "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen",
    "twenty",
)
# The paper's existence detector (L26H8) answers "1" whenever any object is present.
EXISTENCE_WORDS: tuple[str, ...] = ("1", "one", "yes", "exist", "exists", "present", "some", "any")
# The paper's L23H19 decodes "difficult"/"impossible" when the count is large. ("many" is left
# out: every counting question contains it, so copying heads would look "difficult".)
DIFFICULTY_WORDS: tuple[str, ...] = (
    "difficult", "difficulty", "impossible", "hard", "unsure", "uncertain", "unclear", "cannot",
    "unknown", "countless", "numerous", "lots",
)
DEFAULT_VOCABULARIES: dict[str, tuple[str, ...]] = {
    "visual": VISUAL_WORDS,
    "number": NUMBER_WORDS,
    "existence": EXISTENCE_WORDS,
    "difficulty": DIFFICULTY_WORDS,
}


def _spellings(word: str) -> list[str]:
    forms = {word, word.lower(), word.capitalize()}
    return sorted(forms | {" " + form for form in forms})


def word_token_ids(tokenizer, words: Iterable[str], missing: list[str] | None = None) -> set[int]:
    """Token ids that stand for any of `words` (see the module docstring for the rules). missing: if given,
    receives the words of which the tokenizer knows no spelling (each piece ``<unk>`` or nothing)."""
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    unknown = getattr(tokenizer, "unk_token_id", None)
    ids: set[int] = set()
    for word in words:
        if not isinstance(word, str) or not word.strip():
            raise UserInputError(f"vocabulary words must be non-empty strings, got {word!r}")
        known = False
        for spelling in _spellings(word.strip()):
            pieces = tokenizer(spelling, add_special_tokens=False)["input_ids"]
            if not pieces or (unknown is not None and unknown in pieces):
                continue  # the tokenizer does not know this spelling
            known = True
            # the first piece that is more than whitespace starts the word
            first = next((p for p in pieces if tokenizer.decode([p]).strip()), None)
            if first is not None and first not in special:
                ids.add(first)
        if not known and missing is not None:
            missing.append(word)
    return ids


def vocabulary_token_ids(tokenizer, vocabularies: Mapping[str, Iterable[str]] | None = None) -> dict[str, set[int]]:
    """``{name: token ids}`` for every vocabulary (default: `DEFAULT_VOCABULARIES`).

    A word of a vocabulary the caller gave (any list other than the built-in one of that name) that the
    tokenizer cannot spell is a `UserInputError` naming it: it would count through nothing, and the
    vocabulary's scores would silently cover fewer words than asked. The built-in lists are broad on
    purpose; their words a small tokenizer lacks are skipped (logged)."""
    vocabularies = DEFAULT_VOCABULARIES if vocabularies is None else vocabularies
    out = {}
    for name, words in vocabularies.items():
        if isinstance(words, str):
            raise UserInputError(f"vocabulary {name!r} must be a list of words, got the string {words!r}")
        words = list(words) if words is not DEFAULT_VOCABULARIES.get(name) else words
        missing: list[str] = []
        out[name] = word_token_ids(tokenizer, words, missing)
        if missing and words is not DEFAULT_VOCABULARIES.get(name):
            shown = ", ".join(repr(w) for w in missing[:8]) + (f" (+{len(missing) - 8} more)" if len(missing) > 8 else "")
            raise UserInputError(f"vocabulary {name!r}: the tokenizer knows no spelling of {shown} ({len(missing)} of "
                                 f"{len(list(words))} words; each tokenises to <unk>): remove them or use words of the "
                                 "model's vocabulary")
        if missing:
            logger.info("built-in vocabulary %r: %d of its words are not in this tokenizer's vocabulary (skipped)",
                        name, len(missing))
    return out

"""Answer parsing: turn a model's generated text into a count or an option letter.

The conventions follow lmms-eval so numbers are comparable with published tables.

| parser          | used by (lmms-eval task)      | rule                                                    |
|-----------------|-------------------------------|---------------------------------------------------------|
| ``count``       | pixmo_count, our imagefolder  | the first integer in the text; the number words          |
|                 |                               | zero..twenty count as integers (``"three"`` -> 3), so    |
|                 |                               | ``"There are three dots, not 4"`` -> 3. Decimals and     |
|                 |                               | thousands separators are not numbers: ``"2.5"`` -> 2,    |
|                 |                               | as lmms-eval's ``re.search(r"\\d+")`` does; hyphenated  |
|                 |                               | compounds (``"twenty-one"``) are not number words.       |
| ``count_strict``| countbenchqa                  | the whole stripped text must be digits (``"3"``);        |
|                 |                               | ``"3."``, ``"three"`` or ``"3 dots"`` do not parse.      |
| ``choice``      | mmmu_val, realworldqa,        | MMMU's rule: ``(A)`` first; then a bare letter ``A`` as  |
|                 | mathvista (multiple choice)   | a word (``"A"``, ``"A."``, ``"A. text"``, ``"answer: A"``);|
|                 |                               | then the whole answer equal to one option's text; then,  |
|                 |                               | for answers longer than five words, an option's text     |
|                 |                               | inside it. Several candidates -> the one occurring last. |

Differences from MMMU: a letter followed by punctuation (``"A. cat"``, ``"B: dog"``) counts
as a bare letter, and a short answer that is exactly an option's text (``"red"``) picks it;
MMMU misses both. When nothing matches, MMMU picks a random letter; we return ``None``
(unparsed, scored wrong and counted separately) so results are deterministic.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from vlens.datasets.readers import option_letters
from vlens.utils.errors import UserInputError

NUMBER_WORDS: dict[str, int] = {
    word: value
    for value, word in enumerate(
        "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
        "fifteen sixteen seventeen eighteen nineteen twenty".split()
    )
}

# A digit run, or a whole number word. The look-arounds keep a hyphenated compound beyond
# our word list ("twenty-one") from being read as one of its halves (20 or 1).
_COUNT_PATTERN = re.compile(
    r"\d+|(?<![a-z]-)\b(" + "|".join(sorted(NUMBER_WORDS, key=len, reverse=True)) + r")\b(?!-[a-z])",
    re.IGNORECASE,
)
_STRICT_PATTERN = re.compile(r"\d+")


def parse_count(text: str) -> int | None:
    """The first integer in ``text`` (digits or a number word zero..twenty), else None."""
    match = _COUNT_PATTERN.search(text)
    if match is None:
        return None
    token = match.group(0)
    return int(token) if token.isdigit() else NUMBER_WORDS[token.lower()]


def parse_count_strict(text: str) -> int | None:
    """The integer when the stripped text is only digits (CountBenchQA's exact match), else None."""
    stripped = text.strip()
    return int(stripped) if _STRICT_PATTERN.fullmatch(stripped) else None


def parse_choice(text: str, options: Sequence[str]) -> str | None:
    """The option letter a free-form answer picks among ``options`` (MMMU's rule), else None."""
    letters = option_letters(len(options))
    response = " " + text.strip().strip(",.!?;:'") + " "
    # Punctuation after a letter ("A.", "A:", "A,") must not hide it from the " A " rule.
    spaced = re.sub(r"(?<=\b[A-Z])[.,:;)!?]", " ", response)

    bracketed = [c for c in letters if f"({c})" in response]
    if bracketed:
        return max(bracketed, key=lambda c: response.rfind(f"({c})"))
    bare = [c for c in letters if f" {c} " in spaced]
    if bare:
        return max(bare, key=lambda c: spaced.rfind(f" {c} "))
    by_equal_text = [
        c
        for c, option in zip(letters, options, strict=True)
        if option.strip().lower() == response.strip().lower()
    ]
    if by_equal_text:
        return by_equal_text[0]
    if len(response.split()) > 5:
        lowered = response.lower()
        by_text = [
            c
            for c, option in zip(letters, options, strict=True)
            if option.strip() and option.strip().lower() in lowered
        ]
        if by_text:
            return max(by_text, key=lambda c: lowered.rfind(options[letters.index(c)].strip().lower()))
    return None


# name -> (text, options) -> parsed answer; counting parsers ignore the options
ANSWER_PARSERS: dict[str, Callable[[str, Sequence[str] | None], int | str | None]] = {
    "count": lambda text, options: parse_count(text),
    "count_strict": lambda text, options: parse_count_strict(text),
    "choice": lambda text, options: parse_choice(text, options or []),
}


def get_parser(name: str) -> Callable[[str, Sequence[str] | None], int | str | None]:
    """The parser called ``name``; a clear error lists the known ones."""
    if name not in ANSWER_PARSERS:
        raise UserInputError(f"unknown answer parser {name!r}; choose one of {sorted(ANSWER_PARSERS)}")
    return ANSWER_PARSERS[name]

"""The answer-parsing table (lmms-eval conventions, documented in vlens.evaluation.parsing)."""

import pytest

from vlens.evaluation.parsing import get_parser, parse_choice, parse_count, parse_count_strict

COUNT_TABLE = [
    ("3", 3),
    ("  12 ", 12),
    ("There are 7 dots.", 7),
    ("three", 3),
    ("Three dots", 3),
    ("I count twenty", 20),
    ("seventeen", 17),
    ("zero", 0),
    ("There are three dots, not 4", 3),  # first number wins, digits or words
    ("4 or five", 4),
    ("2.5", 2),  # lmms-eval's \d+: no decimals
    ("1,000", 1),
    ("twenty-one boats, maybe 5", 5),  # compounds beyond twenty are not number words
    ("someone", None),  # "one" inside a word is not a number
    ("none", None),
    ("", None),
    ("I cannot tell", None),
]

STRICT_TABLE = [
    ("3", 3),
    (" 10\n", 10),
    ("3.", None),
    ("three", None),
    ("3 dots", None),
    ("", None),
]

OPTIONS = ["red", "green", "blue", "black"]
CHOICE_TABLE = [
    ("B", "B"),
    ("(C)", "C"),
    ("B.", "B"),
    ("A. red", "A"),
    ("The answer is (D).", "D"),
    ("The answer is C", "C"),
    ("Answer: D", "D"),
    ("(A) no wait, (C)", "C"),  # several candidates: the last one
    ("blue", "C"),  # exactly an option's text
    ("I think the colour is green here", "B"),  # option text inside a long answer
    ("Green.", "B"),  # exactly an option text, up to case and end punctuation
    ("it is green", None),  # short and not exactly an option: MMMU looks for no text
    ("E", None),  # not among four options
    ("a cat", None),  # lower case is not a letter
    ("", None),
]


@pytest.mark.parametrize("text,expected", COUNT_TABLE)
def test_parse_count(text, expected):
    assert parse_count(text) == expected


@pytest.mark.parametrize("text,expected", STRICT_TABLE)
def test_parse_count_strict(text, expected):
    assert parse_count_strict(text) == expected


@pytest.mark.parametrize("text,expected", CHOICE_TABLE)
def test_parse_choice(text, expected):
    assert parse_choice(text, OPTIONS) == expected


def test_named_parsers_and_bad_names():
    assert get_parser("count")("five", None) == 5
    assert get_parser("count_strict")("five", None) is None
    assert get_parser("choice")("(B)", ["x", "y"]) == "B"
    with pytest.raises(ValueError, match="unknown answer parser 'digits'.*count_strict"):
        get_parser("digits")
    with pytest.raises(ValueError, match="1 to 26 options"):
        parse_choice("A", [])

"""User-caused errors raise UserInputError (a ValueError: `except ValueError` keeps working);
internal invariants raise other types. No plain `raise ValueError` is left in the package."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from vlens.utils.errors import UserInputError

PACKAGE = Path(__file__).resolve().parents[2] / "vlens"
# file -> why a plain ValueError stays there (empty: none does)
ALLOWED: dict[str, str] = {}


def test_no_plain_value_error_is_raised_in_the_package():
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        count = len(re.findall(r"\braise ValueError\b", path.read_text(encoding="utf-8")))
        if count:
            found[str(path.relative_to(PACKAGE.parent))] = count
    assert set(found) <= set(ALLOWED), {k: v for k, v in found.items() if k not in ALLOWED}


def test_a_bad_argument_is_a_user_input_error_and_a_value_error():
    import torch

    from vlens.utils.stats import wilson_interval

    with pytest.raises(UserInputError, match="level must be in"):
        wilson_interval(torch.tensor([1.0]), torch.tensor([2.0]), level=1.5)
    assert issubclass(UserInputError, ValueError)

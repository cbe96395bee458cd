"""Every result prints a summary (kind, shapes, key numbers), never a tensor's values or pages of text."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import torch

from vlens.utils.results import BUILTIN_KINDS, SUMMARY_CHARS, Result, result_class


@dataclass
class _Planted(Result):
    scores: torch.Tensor
    faithfulness: float
    interval: tuple[float, float]
    edges: list[int]
    html: str
    extra: dict = field(default_factory=dict)

    kind: ClassVar[str] = "test_planted_repr"

    def to_dict(self) -> dict:
        return {}

    def plot(self):
        return None


def test_a_dataclass_result_prints_shapes_and_numbers():
    result = _Planted(torch.arange(1200.0).reshape(3, 400), 0.912345, (0.8, 1.0), list(range(5000)),
                      "<html>" + "x" * 10**6, {"a": 1})
    assert repr(result) == ("_Planted(kind='test_planted_repr', scores=Tensor[3, 400], faithfulness=0.9123, "
                            "interval=(0.8, 1), edges=list[5000], html='<html>xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx...', "
                            "extra=dict[1])")
    assert str(result) == repr(result)


def test_every_builtin_result_kind_uses_the_summary_or_its_own_repr():
    for kind in BUILTIN_KINDS:
        cls = result_class(kind)
        if not (isinstance(cls, type) and issubclass(cls, Result)):
            continue
        # never the repr @dataclass writes, which prints every tensor's values
        assert "__create_fn__" not in cls.__repr__.__qualname__, kind
        assert cls.__repr__ is Result.__repr__ or "__repr__" in vars(cls), kind


def test_a_long_summary_is_cut():
    class Wide(_Planted.__mro__[1]):  # a Result that is not a dataclass, with many attributes
        kind: ClassVar[str] = "test_wide_repr"

        def __init__(self):
            for i in range(100):
                setattr(self, f"number_{i}", float(i))

        def to_dict(self) -> dict:
            return {}

        def plot(self):
            return None

    text = repr(Wide())
    assert text.startswith("Wide(kind='test_wide_repr', number_0=0, number_1=1,") and text.endswith(" ...)")
    assert len(text) == SUMMARY_CHARS

"""Every result has `to_dataframe()`: one tidy row per number of its `to_dict()` (pandas optional)."""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from typing import ClassVar

import pytest

from vlens.utils.results import Result


@dataclass
class _Grid(Result):
    kind: ClassVar[str] = "test_dataframe_grid"
    effects: list
    summary: dict
    label: str = "heads"

    def to_dict(self) -> dict:
        return {"effects": self.effects, "summary": self.summary, "label": self.label}

    def plot(self):  # pragma: no cover - not used
        raise NotImplementedError


def test_rows_are_every_number_with_its_place():
    pytest.importorskip("pandas")
    result = _Grid(effects=[[1.0, 2.5], [None, -3.0]], summary={"mean": 0.25, "n": 4, "ok": True})
    frame = result.to_dataframe()
    assert list(frame.columns) == ["field", "index", "value"]
    rows = list(frame.itertuples(index=False, name=None))
    assert rows[:2] == [("effects", (0, 0), 1.0), ("effects", (0, 1), 2.5)]
    assert rows[2][:2] == ("effects", (1, 0)) and math.isnan(rows[2][2])  # JSON null: NaN
    assert rows[3:] == [("effects", (1, 1), -3.0), ("summary.mean", (), 0.25), ("summary.n", (), 4.0),
                        ("summary.ok", (), 1.0)]  # the string label is left out


def test_without_pandas_the_error_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "pandas", None)
    with pytest.raises(ImportError, match="pip install pandas"):
        _Grid(effects=[1.0], summary={}).to_dataframe()

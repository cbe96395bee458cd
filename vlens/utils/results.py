"""The protocol of every results object: `to_dict()`, `save(path)`, `plot()`.

    result.to_dict()          # a JSON-safe dict (NaN / inf written as None)
    result.save("out/")       # out/results.json (a path ending in .json is the file itself)
    result.plot().show()      # a plotly figure (needs the `viz` extra)

The `vlens` command line writes each command's result the same way (`--out DIR` holds
`results.json` and the figures).
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, ClassVar

from vlens.utils.finite import json_safe
from vlens.utils.provenance import stamp

RESULTS_FILE = "results.json"


class Result(ABC):
    """Base of every results object (patching, lenses, head scores, ablation, temperatures, ...)."""

    filename: ClassVar[str] = RESULTS_FILE  # what `save(folder)` writes inside the folder

    @abstractmethod
    def to_dict(self) -> dict:
        """Everything needed to read the result back: JSON-safe (lists, numbers, strings, None)."""

    @abstractmethod
    def plot(self, *args: Any, **kwargs: Any) -> Any:
        """The result's main figure (a plotly Figure; needs the `viz` extra)."""

    def save(self, path: str | Path) -> Path:
        """Write `to_dict()` as strict JSON, with its `provenance` (`vlens.utils.provenance.stamp`): to
        `path` if it ends in .json, else to `path / filename` (folders are created). Returns the file written."""
        path = Path(path)
        target = path if path.suffix == ".json" else path / self.filename
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(json_safe(stamp(self.to_dict())), indent=1, allow_nan=False) + "\n",
                          encoding="utf-8")
        return target

    @classmethod
    def read_saved(cls, path: str | Path) -> dict:
        """The dict a `save` wrote: the JSON file itself, or `path / filename` for a folder."""
        path = Path(path)
        return json.loads((path / cls.filename if path.is_dir() else path).read_text(encoding="utf-8"))

"""`DemoResults`: what `vlens demo` writes to results.json (the model, settings, timings, sections)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from vlens.utils.results import Result
from vlens.viz.optional import require_plotly


@dataclass
class DemoResults(Result):
    """The demo's results.json: `sections` holds every section of the report by key (its numbers,
    tables and findings), in `section_order`; `timings_s` the seconds each stage took."""

    schema_version: int
    model: dict
    settings: dict
    timings_s: dict
    section_order: list[str]
    sections: dict[str, dict] = field(default_factory=dict)

    kind: ClassVar[str] = "demo"

    def to_dict(self) -> dict:
        return {"schema_version": self.schema_version, "model": self.model, "settings": self.settings,
                "timings_s": self.timings_s, "section_order": list(self.section_order), "sections": self.sections}

    @classmethod
    def from_dict(cls, data: dict) -> DemoResults:
        return cls(schema_version=data["schema_version"], model=data["model"], settings=data["settings"],
                   timings_s=data["timings_s"], section_order=list(data["section_order"]),
                   sections=data["sections"])

    def plot(self, title: str = "vlens demo: seconds per stage"):
        """Bars: the seconds each stage of the demo took."""
        go = require_plotly()
        stages = {name: value for name, value in self.timings_s.items() if name != "total"}
        figure = go.Figure(go.Bar(x=list(stages), y=list(stages.values())))
        return figure.update_layout(title=title, yaxis={"title": "seconds"})


__all__ = ["DemoResults"]

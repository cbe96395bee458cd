"""`SteeringResult`: a strength sweep's generated texts side by side."""

from __future__ import annotations

import html
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from vlens.utils.results import Result, own_fields
from vlens.viz.optional import require_plotly

HTML_FILE = "steering.html"


@dataclass
class SteeringResult(Result):
    """prompts: [batch] prompt texts; strengths: [n]; texts / tokens: [n][batch] the generation at each
    strength; plain_texts / plain_tokens: [batch] the generation without hooks; settings: the
    `SteeringSettings` as a dict; direction_norm: its L2 norm; source: where the direction came from."""

    kind: ClassVar[str] = "steering"
    # checked when a file is read: [n][batch] generations, one per strength and prompt
    saved_dims: ClassVar[dict[str, str]] = {"prompts": "batch", "plain_texts": "batch", "plain_tokens": "batch",
                                            "strengths": "n", "texts": "n", "tokens": "n", "texts[*]": "batch",
                                            "tokens[*]": "batch"}

    prompts: list[str]
    strengths: list[float]
    texts: list[list[str]]
    tokens: list[list[list[int]]]
    plain_texts: list[str]
    plain_tokens: list[list[int]]
    settings: dict = field(default_factory=dict)
    direction_norm: float = 0.0
    source: str = ""

    def to_dict(self) -> dict:
        return {"prompts": self.prompts, "strengths": self.strengths, "texts": self.texts, "tokens": self.tokens,
                "plain_texts": self.plain_texts, "plain_tokens": self.plain_tokens, "settings": self.settings,
                "direction_norm": self.direction_norm, "source": self.source}

    @classmethod
    def from_dict(cls, data: dict) -> SteeringResult:
        return cls(**own_fields(cls, data))

    def table(self) -> list[dict[str, Any]]:
        """One row per prompt: the prompt, the plain text, then the text at each strength."""
        return [{"prompt": prompt, "plain": self.plain_texts[row],
                 **{f"strength {s:g}": self.texts[i][row] for i, s in enumerate(self.strengths)}}
                for row, prompt in enumerate(self.prompts)]

    def plot(self) -> Any:
        """A plotly table: prompts down, strengths across."""
        go = require_plotly()
        rows = self.table()
        header = list(rows[0]) if rows else ["prompt"]
        cells = [[row[key] for row in rows] for key in header]
        figure = go.Figure(go.Table(header={"values": header}, cells={"values": cells, "align": "left"}))
        figure.update_layout(title=f"Steering: {self.source or 'direction'} (norm {self.direction_norm:.3g}) at "
                                   f"layers {self.settings.get('layers')}")
        return figure

    def to_html(self) -> str:
        """A plain offline HTML page with the texts side by side (no script)."""
        rows = self.table()
        header = list(rows[0]) if rows else ["prompt"]
        head = "".join(f"<th>{html.escape(k)}</th>" for k in header)
        body = "".join("<tr>" + "".join(f"<td>{html.escape(str(row[k]))}</td>" for k in header) + "</tr>"
                       for row in rows)
        title = html.escape(f"Steering: {self.source or 'direction'} at layers {self.settings.get('layers')}, "
                            f"{self.settings.get('hook')}")
        return ('<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
                f"<title>{title}</title>\n<style>table{{border-collapse:collapse}}td,th{{border:1px solid #999;"
                f"padding:4px 8px;vertical-align:top;text-align:left}}</style>\n</head>\n<body>\n<h1>{title}</h1>\n"
                f"<table>\n<tr>{head}</tr>\n{body}\n</table>\n</body>\n</html>\n")

    def save(self, path: str | Path) -> Path:
        """results.json (and steering.html beside it when `path` is a folder)."""
        written = super().save(path)
        if Path(path).suffix != ".json":
            (written.parent / HTML_FILE).write_text(self.to_html(), encoding="utf-8")
        return written

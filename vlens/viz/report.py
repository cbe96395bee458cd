"""A self-contained HTML report: one file, works offline, one section per result.

plotly.js is inlined once in the page head (never a CDN; `vlens.viz.html` picks the bundle), the
circuitsvis bundle once if any section has a circuitsvis view, images are base64 PNG data URIs
and tables plain HTML.
"""

from __future__ import annotations

import html as html_lib
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from vlens.utils.errors import UserInputError
from vlens.viz.circuits import circuitsvis_bundle_js, circuitsvis_html
from vlens.viz.html import figure_div, inline_script, plotly_head_script
from vlens.viz.image_attention import image_to_data_uri

Number = int | float | bool | str | None

_CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 0; background: #f6f7f9;
       color: #1d2430; line-height: 1.45; }
main { max-width: 1100px; margin: 0 auto; padding: 24px 20px 48px; }
header h1 { margin: 8px 0 4px; font-size: 1.7em; }
header p { margin: 0 0 12px; color: #4a5568; }
nav ol { margin: 0 0 20px; padding-left: 22px; columns: 2; color: #4a5568; }
nav a { color: #2b6cb0; text-decoration: none; }
section { background: white; border: 1px solid #e2e8f0; border-radius: 8px; padding: 16px 20px;
          margin: 0 0 18px; overflow-x: auto; }
section h2 { margin: 0 0 4px; font-size: 1.2em; }
p.explanation { margin: 0 0 12px; color: #4a5568; }
img.figure { max-width: 100%; height: auto; image-rendering: pixelated; border-radius: 4px; }
table { border-collapse: collapse; margin: 8px 0; font-size: 0.88em; max-width: 100%; }
th, td { border: 1px solid #e2e8f0; padding: 3px 7px; text-align: right; }
td.text { text-align: left; max-width: 260px; overflow-wrap: break-word; }
ul.findings { margin: 8px 0; padding-left: 20px; font-size: 0.92em; }
dl.definitions { margin: 6px 0 0; font-size: 0.88em; color: #4a5568; }
dl.definitions dt { display: inline; font-weight: 600; color: #1d2430; }
dl.definitions dd { display: inline; margin: 0 10px 0 4px; }
th { background: #f1f4f8; } td:first-child, th:first-child { text-align: left; }
dl.numbers { display: flex; flex-wrap: wrap; gap: 8px; margin: 10px 0 0; }
dl.numbers div { background: #f1f4f8; border-radius: 6px; padding: 4px 10px; }
dl.numbers dt { display: inline; color: #4a5568; } dl.numbers dd { display: inline; margin: 0 0 0 6px;
          font-weight: 600; font-variant-numeric: tabular-nums; }
footer { color: #718096; font-size: 0.85em; text-align: center; }
"""


def _plain(value, name: str) -> Number:
    """A JSON-friendly scalar: tensors / numpy scalars become Python numbers, NaN/inf become None."""
    if isinstance(value, torch.Tensor | np.ndarray | np.generic):
        size = value.numel() if isinstance(value, torch.Tensor) else np.size(value)
        if size != 1:
            raise TypeError(f"{name} must be a scalar, got an array of shape {tuple(value.shape)}")
        value = value.item()
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    raise TypeError(f"{name} must be a number or a string, got {type(value).__name__}")


def _format(value: Number) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "n/a" if value is None else str(value)


def _cell(value: Number) -> str:
    """A table cell; text (not a number) is left-aligned and may wrap."""
    css = ' class="text"' if isinstance(value, str) else ""
    return f"<td{css}>{html_lib.escape(_format(value))}</td>"


@dataclass
class _Section:
    title: str
    explanation: str
    anchor: str
    figure: Any = None  # a plotly Figure (viz extra)
    image: Image.Image | None = None
    html: str | None = None
    is_circuitsvis: bool = False
    table: list[dict[str, Number]] | None = None
    definitions: dict[str, str] = field(default_factory=dict)
    numbers: dict[str, Number] = field(default_factory=dict)


class Report:
    """An HTML report built section by section.

    Example:
        report = Report("Counting circuit of the tiny model")
        report.add_section("Overwrite rate per layer", "Patched final token flips the answer from L3.",
                           figure=layer_region_figure(...), numbers={"peak layer": 3})
        report.write("report.html")
    """

    def __init__(self, title: str, intro: str = ""):
        if not isinstance(title, str) or not title.strip():
            raise UserInputError("a report needs a non-empty title")
        self.title = title.strip()
        self.intro = intro.strip()
        self._sections: list[_Section] = []

    def __len__(self) -> int:
        return len(self._sections)

    @property
    def section_titles(self) -> list[str]:
        return [section.title for section in self._sections]

    def add_section(
        self,
        title: str,
        explanation: str,
        figure=None,
        html=None,
        image: Image.Image | None = None,
        table: Sequence[Mapping[str, object]] | None = None,
        numbers: Mapping[str, object] | None = None,
        definitions: Mapping[str, str] | None = None,
    ) -> Report:
        """Add a section; everything but the title and its one-line explanation is optional.

        Args:
            title: the section heading (also its anchor in the contents).
            explanation: one line saying what the section shows and what to read from it.
            figure: a `plotly.graph_objects.Figure`.
            html: an HTML string, or a circuitsvis view (e.g. from `attention_heads_view`).
            image: a PIL image (embedded as PNG).
            table: rows as dicts (columns: the keys, in first-seen order).
            numbers: headline numbers shown under the section and returned by `to_dict`.
            definitions: abbreviation -> meaning, shown right under the table (every abbreviated
                column header should have one).

        Returns:
            The report, so calls can be chained.
        """
        if not isinstance(title, str) or not title.strip():
            raise UserInputError("a section needs a non-empty title")
        if not isinstance(explanation, str) or not explanation.strip():
            raise UserInputError(f"section {title!r} needs a one-line explanation")
        section = _Section(title.strip(), " ".join(explanation.split()), self._anchor(title))
        if figure is not None:
            if not callable(getattr(figure, "to_html", None)) or not hasattr(figure, "data"):
                raise TypeError(f"figure must be a plotly Figure, got {type(figure).__name__}")
            section.figure = figure
        if image is not None:
            if not isinstance(image, Image.Image):
                raise TypeError(f"image must be a PIL image, got {type(image).__name__}")
            section.image = image
        if html is not None:
            section.html, section.is_circuitsvis = self._html_snippet(html, section.anchor)
        if table is not None:
            section.table = self._checked_table(table, title)
        section.definitions = {str(k): str(v) for k, v in (definitions or {}).items()}
        for key, value in (numbers or {}).items():
            section.numbers[str(key)] = _plain(value, f"numbers[{key!r}] of section {title!r}")
        self._sections.append(section)
        return self

    def _anchor(self, title: str) -> str:
        base = re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-") or "section"
        taken = {section.anchor for section in self._sections}
        anchor, suffix = base, 2
        while anchor in taken:
            anchor, suffix = f"{base}-{suffix}", suffix + 1
        return anchor

    @staticmethod
    def _html_snippet(content, anchor: str) -> tuple[str, bool]:
        if isinstance(content, str):
            return content, False
        if isinstance(getattr(content, "local_src", None), str):
            return circuitsvis_html(content, div_id=f"{anchor}-circuitsvis"), True
        raise TypeError(f"html must be a string or a circuitsvis view, got {type(content).__name__}")

    @staticmethod
    def _checked_table(table, title: str) -> list[dict[str, Number]]:
        rows = list(table)
        if not rows or not all(isinstance(row, Mapping) for row in rows):
            raise UserInputError(f"table of section {title!r} must be a non-empty list of dicts")
        return [
            {str(k): _plain(v, f"table cell {k!r} of section {title!r}") for k, v in row.items()}
            for row in rows
        ]

    def to_dict(self) -> dict:
        """The report's numbers: `{"title", "sections": [{"title", "explanation", "numbers"}]}`."""
        sections = [
            {"title": s.title, "explanation": s.explanation, "numbers": s.numbers} for s in self._sections
        ]
        return {"title": self.title, "sections": sections}

    def to_html(self) -> str:
        """The whole report as one HTML document (no network access needed to view it)."""
        figures = [section.figure for section in self._sections if section.figure is not None]
        scripts = [plotly_head_script(figures)] if figures else []
        if any(section.is_circuitsvis for section in self._sections):
            scripts.append(inline_script(circuitsvis_bundle_js()))
        escape = html_lib.escape
        contents = "".join(f'<li><a href="#{s.anchor}">{escape(s.title)}</a></li>' for s in self._sections)
        body = "\n".join(self._render_section(index, section) for index, section in enumerate(self._sections))
        intro = f"<p>{escape(self.intro)}</p>" if self.intro else ""
        return (
            '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
            '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
            f"<title>{escape(self.title)}</title>\n<style>{_CSS}</style>\n"
            + "\n".join(scripts)
            + f"\n</head>\n<body>\n<main>\n<header><h1>{escape(self.title)}</h1>{intro}</header>\n"
            f"<nav><ol>{contents}</ol></nav>\n{body}\n"
            "<footer>Generated by vlens.</footer>\n</main>\n</body>\n</html>\n"
        )

    def write(self, path: str | Path) -> Path:
        """Write the report as one HTML file (parent folders are created) and return its path."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.to_html(), encoding="utf-8")
        return path

    @staticmethod
    def _render_section(index: int, section: _Section) -> str:
        escape = html_lib.escape
        parts = [
            f'<section id="{section.anchor}">',
            f"<h2>{escape(section.title)}</h2>",
            f'<p class="explanation">{escape(section.explanation)}</p>',
        ]
        if section.figure is not None:
            parts.append(figure_div(section.figure, f"figure-{index}"))
        if section.image is not None:
            uri = image_to_data_uri(section.image)
            parts.append(f'<img class="figure" src="{uri}" alt="{escape(section.title)}">')
        if section.html is not None:
            parts.append(section.html)
        if section.table is not None:
            columns = list(dict.fromkeys(key for row in section.table for key in row))
            head = "".join(f"<th>{escape(c)}</th>" for c in columns)
            rows = "".join(
                "<tr>" + "".join(_cell(row.get(c)) for c in columns) + "</tr>" for row in section.table
            )
            parts.append(f"<table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>")
        if section.definitions:
            items = "".join(
                f"<dt>{escape(term)}</dt><dd>{escape(meaning)}</dd>" for term, meaning in section.definitions.items()
            )
            parts.append(f'<dl class="definitions">{items}</dl>')
        if section.numbers:
            items = "".join(
                f"<div><dt>{escape(key)}</dt><dd>{escape(_format(value))}</dd></div>"
                for key, value in section.numbers.items()
            )
            parts.append(f'<dl class="numbers">{items}</dl>')
        parts.append("</section>")
        return "\n".join(parts)

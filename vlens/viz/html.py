"""plotly in HTML files that work offline: the one way every vlens HTML output includes plotly.js.

Every HTML file vlens writes (the `vlens demo` report, `vlens patch` / `logit-lens` / `headlens` /
`ablate` / `eval` figures, `Report.write`) inlines plotly.js once, in the page head, so the file
opens with no network access and can be moved or mailed alone. Which bundle:

- plotly.js's *cartesian* partial bundle (1.5 MB; traces bar, box, contour, heatmap, histogram,
  histogram2d, histogram2dcontour, image, pie, scatter, scatterternary, violin), vendored in
  `vlens/viz/vendor/` with its MIT licence, when every trace on the page is one of those and the
  installed plotly.py was built for the same plotly.js version (figure JSON and plotly.js must agree);
- otherwise the full plotly.js shipped with the installed plotly (4.8 MB), so a figure with any
  other trace type (3-D, maps, ...) or another plotly version still renders.

See docs/figures.md for the measured page sizes.
"""

from __future__ import annotations

import html as html_lib
import re
from collections.abc import Iterable
from functools import lru_cache
from pathlib import Path

from vlens.viz.optional import require_plotly

VENDOR = Path(__file__).parent / "vendor"
CARTESIAN_BUNDLE = VENDOR / "plotly-cartesian.min.js"
# The trace modules of plotly.js-cartesian-dist-min (its README lists them).
CARTESIAN_TRACES = frozenset({
    "bar", "box", "contour", "heatmap", "histogram", "histogram2d", "histogram2dcontour", "image", "pie",
    "scatter", "scatterternary", "violin",
})
_VERSION = re.compile(r"plotly\.js(?: \([\w -]+\))? v(\d+\.\d+\.\d+)")
PLOTLY_CONFIG = {"displaylogo": False, "responsive": True}


@lru_cache(maxsize=1)
def _cartesian_source() -> tuple[str, str]:
    text = CARTESIAN_BUNDLE.read_text(encoding="utf-8")
    match = _VERSION.search(text[:300])
    if match is None:
        raise RuntimeError(f"{CARTESIAN_BUNDLE} has no plotly.js version header")
    return match[1], text


def installed_plotly_js_version() -> str:
    """The plotly.js version the installed plotly.py writes figures for."""
    require_plotly()
    from plotly.offline import get_plotlyjs_version

    return get_plotlyjs_version()


def trace_types(figures: Iterable) -> set[str]:
    """Every trace type drawn by the figures (`scatter`, `heatmap`, ...)."""
    return {trace.type for figure in figures for trace in figure.data}


def plotly_bundle(types: Iterable[str]) -> tuple[str, str]:
    """`(name, source)` of the plotly.js bundle for a page drawing these trace types.

    name is "cartesian" (the vendored partial bundle) or "full" (the installed plotly's own).
    """
    types = set(types)
    version, source = _cartesian_source()
    if types <= CARTESIAN_TRACES and version == installed_plotly_js_version():
        return "cartesian", source
    from plotly.offline import get_plotlyjs

    return "full", get_plotlyjs()


def inline_script(source: str) -> str:
    """A classic `<script>` holding `source` (a literal `</script>` inside would end it early)."""
    escaped = source.replace("</script>", "<\\/script>")
    return f'<script type="text/javascript">{escaped}</script>'


def plotly_head_script(figures: Iterable) -> str:
    """The `<script>` with plotly.js for a page showing these figures ("" when there are none)."""
    figures = list(figures)
    if not figures:
        return ""
    name, source = plotly_bundle(trace_types(figures))
    return f"<!-- plotly.js ({name} bundle), inlined: this page needs no network -->\n{inline_script(source)}"


_LONG_DECIMALS = re.compile(r"(?<![\w.])(-?\d+\.\d{5})\d+")


def compact_numbers(text: str) -> str:
    """Cut every decimal number in a figure's JSON to 5 decimals (0.43600720516474073 -> 0.43600).

    A drawn figure needs no more (hover labels show 3-4 digits); the exact values stay in the
    result files. It roughly halves the data of a scatter or attention figure. Base64 images
    and identifiers contain no "digits.digits" run, so only numbers change.
    """
    return _LONG_DECIMALS.sub(r"\1", text)


def figure_div(figure, div_id: str) -> str:
    """The `<div>` + `Plotly.newPlot` call of one figure, for a page whose head loads plotly.js."""
    return compact_numbers(figure.to_html(full_html=False, include_plotlyjs=False, div_id=div_id,
                                          config=PLOTLY_CONFIG))


def figure_page(figure, title: str | None = None) -> str:
    """One figure as a whole HTML document that works offline (plotly.js inlined once)."""
    if not callable(getattr(figure, "to_html", None)) or not hasattr(figure, "data"):
        raise TypeError(f"expected a plotly Figure, got {type(figure).__name__}")
    if title is None:
        layout_title = figure.layout.title.text if figure.layout.title is not None else None
        title = layout_title or "vlens figure"
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"<title>{html_lib.escape(title)}</title>\n{plotly_head_script([figure])}\n</head>\n<body>\n"
        f"{figure_div(figure, 'figure')}\n</body>\n</html>\n"
    )


def write_figure_html(figure, path: str | Path, title: str | None = None) -> Path:
    """Write `figure` as a self-contained HTML file (works offline); returns the path.

    Use this instead of `figure.write_html(...)`, whose default loads plotly.js from a CDN (blank
    offline) or inlines the full 4.8 MB bundle.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(figure_page(figure, title), encoding="utf-8")
    return path

"""Look at what an HTML page renders in headless Chromium: one browser run per page.

`inspect_page(path)` injects a small script before any other, loads the page offline, and
returns what plotly actually laid out: per figure the trace types (and whether the loaded
plotly.js bundle knows them), every axis's tick values, subplot-title / bar-label / tick-label
boxes, colour axes; per table its width against the room it has, its headers and the terms
defined under it; and every console error. `page_problems(checks)` turns that into a list of
human-readable problems (empty = the page is fine). `screenshot(path, png)` draws a page.

Used by the browser tests (skipped with a reason when /usr/bin/chromium is absent) and by
benchmarks/regenerate_figures.py for the screenshots in docs/.
"""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
import tempfile
from itertools import combinations
from pathlib import Path

CHROMIUM = Path("/usr/bin/chromium")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync", "--hide-scrollbars",
         "--allow-file-access-from-files"]
SKIP_REASON = "Debian chromium (/usr/bin/chromium) is not installed (.ci/run installs it)"

# Runs before every other script of the page: records errors, then inspects the rendered page.
_PROBE = r"""<script>
(function () {
  window.__vlensErrors = [];
  window.addEventListener("error", e => window.__vlensErrors.push("error: " + e.message));
  for (const level of ["error", "warn"]) {
    const original = console[level];
    console[level] = (...args) => { window.__vlensErrors.push(level + ": " + args.join(" ")); original.apply(console, args); };
  }
  const box = e => { const r = e.getBoundingClientRect(); return [r.left, r.top, r.right, r.bottom, (e.textContent || "").trim()]; };
  const boxes = (root, selector) => [...root.querySelectorAll(selector)].map(box).filter(b => b[2] > b[0] && b[3] > b[1]);
  function figures() {
    return [...document.querySelectorAll(".plotly-graph-div")].map(gd => {
      const layout = gd._fullLayout || {}, section = gd.closest("section");
      const axes = {};
      for (const key of Object.keys(layout)) {
        if (!/^[xy]axis\d*$/.test(key)) continue;
        const ax = layout[key];
        axes[key] = {title: ax.title ? (ax.title.text || "") : "", visible: ax.visible !== false, type: ax.type,
                     ticks: (ax._vals || []).map(v => v.x), anchor: ax.anchor};
      }
      return {
        id: gd.id, section: section ? section.id : null, drawn: !!gd.querySelector(".main-svg"),
        // plotly.js silently draws a trace type its bundle lacks as "scatter": compare with what was asked
        traces: (gd._fullData || []).map((t, i) => ({
          type: (gd.data[i] && gd.data[i].type) || t.type,
          known: !!t._module && (!gd.data[i] || !gd.data[i].type || gd.data[i].type === t.type), visible: t.visible, coloraxis: t.coloraxis || null,
          zmin: t.zmin, zmax: t.zmax, xaxis: t.xaxis || null, yaxis: t.yaxis || null, mode: t.mode || null,
          dash: t.line ? t.line.dash : null, symbol: t.marker ? t.marker.symbol : null, name: t.name,
          // a trace of disconnected segments (x holds nulls) draws graph edges, not a curve
          segments: Array.isArray(gd.data[i] && gd.data[i].x) && gd.data[i].x.some(v => v === null)})),
        axes,
        titles: boxes(gd, ".annotation-text"),
        bartext: boxes(gd, ".bartext"),
        xticks: boxes(gd, ".xtick text"),
        yticks: boxes(gd, ".ytick text"),
        colorbars: gd.querySelectorAll(".colorbar").length,
      };
    });
  }
  function tables() {
    return [...document.querySelectorAll("section table")].map(t => {
      const section = t.closest("section"), style = getComputedStyle(section);
      const next = t.nextElementSibling;
      const defined = next && next.matches("dl.definitions") ? [...next.querySelectorAll("dt")].map(d => d.textContent.trim()) : [];
      return {section: section.id, width: t.getBoundingClientRect().width,
              room: section.clientWidth - parseFloat(style.paddingLeft) - parseFloat(style.paddingRight),
              headers: [...t.querySelectorAll("th")].map(th => th.textContent.trim()), defined};
    });
  }
  window.addEventListener("load", () => setTimeout(() => {
    let out;
    try {
      out = {errors: window.__vlensErrors, figures: figures(), tables: tables(),
             sections: [...document.querySelectorAll("section")].map(s => {
               const r = s.getBoundingClientRect();
               return {id: s.id, top: r.top + window.scrollY, height: r.height,
                       explanation: (s.querySelector("p.explanation") || {}).textContent || ""}; }),
             circuitsvis: document.querySelectorAll('[id$="-circuitsvis"] *').length,
             width: document.documentElement.scrollWidth};
    } catch (e) { out = {fatal: String(e && e.stack || e)}; }
    const pre = document.createElement("pre");
    pre.id = "vlens-checks";
    pre.textContent = JSON.stringify(out);
    document.body.appendChild(pre);
  }, WAIT_MS));
})();
</script>"""


def available() -> bool:
    return CHROMIUM.exists()


def _run(args: list[str], profile: Path, timeout: int) -> subprocess.CompletedProcess:
    return subprocess.run([str(CHROMIUM), *FLAGS, f"--user-data-dir={profile}", *args],
                          capture_output=True, text=True, timeout=timeout)


def inspect_page(path: str | Path, wait_ms: int = 1500, width: int = 1000, timeout: int = 240) -> dict:
    """Load the page (a copy with the probe injected) and return what it rendered (see the module doc)."""
    page = Path(path).read_text(encoding="utf-8")
    probe = _PROBE.replace("WAIT_MS", str(int(wait_ms)))
    with tempfile.TemporaryDirectory(prefix="vlens-browser-") as tmp:
        copy = Path(tmp) / "page.html"
        head = re.search(r"<head[^>]*>", page)
        if head is None:
            raise ValueError(f"{path} has no <head>")
        copy.write_text(page[:head.end()] + "\n" + probe + page[head.end():], encoding="utf-8")
        result = _run([f"--window-size={width},1000", "--virtual-time-budget=60000", "--dump-dom", copy.as_uri()],
                      Path(tmp) / "profile", timeout)
    if result.returncode != 0:
        raise RuntimeError(f"chromium failed on {path}: {result.stderr[-2000:]}")
    match = re.search(r'<pre id="vlens-checks">(.*?)</pre>', result.stdout, re.DOTALL)
    if match is None:
        raise RuntimeError(f"{path} never finished loading (no probe output); stderr: {result.stderr[-1000:]}")
    checks = json.loads(html.unescape(match[1]))
    if "fatal" in checks:
        raise RuntimeError(f"the probe failed on {path}: {checks['fatal']}")
    return checks


def screenshot(path: str | Path, png: str | Path, width: int = 1200, height: int = 900, timeout: int = 240) -> Path:
    """A PNG of the page's first `height` pixels at `width` (offline, after scripts ran)."""
    png = Path(png)
    png.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="vlens-shot-") as tmp:
        result = _run([f"--window-size={width},{height}", "--virtual-time-budget=60000",
                       f"--screenshot={png}", Path(path).resolve().as_uri()], Path(tmp) / "profile", timeout)
    if result.returncode != 0 or not png.is_file():
        raise RuntimeError(f"chromium could not screenshot {path}: {result.stderr[-2000:]}")
    return png


def _overlaps(boxes: list, slack: float = 1.0) -> list[tuple[str, str]]:
    """Pairs of text boxes that intersect by more than `slack` pixels each way (a negative slack
    also flags boxes closer than -slack pixels: text that runs into its neighbour)."""
    out = []
    for a, b in combinations(boxes, 2):
        if min(a[2], b[2]) - max(a[0], b[0]) > slack and min(a[3], b[3]) - max(a[1], b[1]) > slack:
            out.append((a[4], b[4]))
    return out


ABBREVIATION = re.compile(r"\b[A-Z]{2,}\b")
# Abbreviations of vlens's own scores and metrics, caught in any case ("vgs" is VGS).
KNOWN_ABBREVIATIONS = re.compile(r"\b(vgs|cter|mae|ci|vap|atp|ld)\b", re.IGNORECASE)


def figure_problems(figure: dict) -> list[str]:
    """What is wrong with one laid-out plotly figure (empty: nothing)."""
    where = f"{figure['section'] or 'page'} / {figure['id']}"
    problems = []
    if not figure["drawn"]:
        problems.append(f"{where}: the figure did not draw")
    for trace in figure["traces"]:
        if not trace["known"]:
            problems.append(f"{where}: trace type {trace['type']!r} is not in the loaded plotly.js bundle")
    for name, axis in figure["axes"].items():
        if axis["visible"] and "layer" in axis["title"].lower() and axis["type"] == "linear":
            odd = [t for t in axis["ticks"] if abs(t - round(t)) > 1e-9]
            if odd:
                problems.append(f"{where}: {name} ('{axis['title']}') has ticks between layers: {odd}")
    for a, b in _overlaps(figure["titles"], slack=-4):
        problems.append(f"{where}: titles overlap: {a!r} / {b!r}")
    for a, b in _overlaps(figure["bartext"], slack=0.5):
        problems.append(f"{where}: bar labels overprint: {a!r} / {b!r}")
    for a, b in _overlaps(figure["xticks"], slack=0.5):
        problems.append(f"{where}: x tick labels overlap: {a!r} / {b!r}")
    for a, b in _overlaps(figure.get("yticks", []), slack=0.5):
        problems.append(f"{where}: y tick labels overlap: {a!r} / {b!r}")
    heatmaps = [t for t in figure["traces"] if t["type"] == "heatmap" and t["visible"] is not False]
    if len(heatmaps) > 1:  # tiles compared side by side must share one colour scale
        scales = {(t["coloraxis"],) if t["coloraxis"] else (t["zmin"], t["zmax"]) for t in heatmaps}
        if len(scales) > 1:
            problems.append(f"{where}: {len(heatmaps)} heatmaps with {len(scales)} different colour scales")
    lines: dict = {}
    for t in figure["traces"]:
        curve = t["type"] == "scatter" and t["mode"] and "lines" in t["mode"] and not t.get("segments")
        if curve and t["visible"] is not False:  # graph edges (segment traces) are told apart by colour and width
            lines.setdefault((t["xaxis"], t["yaxis"]), []).append((t["dash"], t["symbol"], t["name"]))
    for styles in lines.values():
        names = [s[2] for s in styles if s[2]]
        if len(names) > 1 and len({s[:2] for s in styles}) < len(styles):
            problems.append(f"{where}: lines {names} share a dash and marker: coinciding curves hide each other")
    return problems


def table_problems(table: dict) -> list[str]:
    problems = []
    if table["width"] > table["room"] + 1:
        problems.append(f"{table['section']}: table is {table['width']:.0f}px wide in {table['room']:.0f}px (cut off)")
    defined = set(table["defined"])
    for header in table["headers"]:
        for term in set(ABBREVIATION.findall(header)) | {t.upper() for t in KNOWN_ABBREVIATIONS.findall(header)}:
            if term not in {d.upper() for d in defined} and header not in defined:
                problems.append(f"{table['section']}: column {header!r} uses {term!r}, not defined next to the table")
    return problems


def page_problems(checks: dict) -> list[str]:
    """Every problem `inspect_page` found: console errors, figure and table problems, a page wider than the window."""
    problems = [f"console: {e}" for e in checks["errors"]]
    for figure in checks["figures"]:
        problems += figure_problems(figure)
    for table in checks["tables"]:
        problems += table_problems(table)
    return problems


def node_available() -> bool:
    return shutil.which("node") is not None


def section_screenshots(report: str | Path, out_dir: str | Path, width: int = 1100,
                        names: dict[str, str] | None = None) -> list[Path]:
    """One PNG per `<section>` of a report page (the others hidden), named `<section id>.png`
    or `names[section id]`; returns the paths."""
    report = Path(report)
    out_dir = Path(out_dir)
    checks = inspect_page(report, width=width)
    page = report.read_text(encoding="utf-8")
    written = []
    with tempfile.TemporaryDirectory(prefix="vlens-sections-") as tmp:
        for section in checks["sections"]:
            style = (f"<style>main > *:not(#{section['id']}) {{ display: none !important; }} "
                     "main { padding-top: 8px; } section { margin: 0; }</style>")
            copy = Path(tmp) / f"{section['id']}.html"
            copy.write_text(page.replace("</head>", style + "</head>", 1), encoding="utf-8")
            name = (names or {}).get(section["id"], section["id"])
            written.append(screenshot(copy, out_dir / f"{name}.png", width=width,
                                      height=int(section["height"]) + 24))
    return written

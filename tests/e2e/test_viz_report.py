"""The self-contained HTML report: sections, inlined scripts, offline safety, numbers as JSON."""

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from PIL import Image

from vlens.viz.circuits import attention_heads_view
from vlens.viz.figures import count_accuracy_figure, jaccard_matrix_figure, layer_head_heatmap
from vlens.viz.report import Report, require_plotly_js

CHROMIUM = Path("/usr/bin/chromium")


@pytest.fixture(scope="module")
def report() -> Report:
    report = Report("Counting circuit", intro="Tiny model, SynDot pairs.")
    report.add_section(
        "Head effects",
        "Which heads move the answer when patched.",
        figure=layer_head_heatmap(torch.randn(3, 4)),
        numbers={"top head effect": torch.tensor(0.75)},
    )
    report.add_section(
        "Accuracy per count",
        "Accuracy falls beyond four objects.",
        figure=count_accuracy_figure([1, 2, 3], [1.0, 0.8, 0.4]),
        table=[{"count": 1, "accuracy": 1.0}, {"count": 2, "accuracy": 0.8, "note": "<b>bold?</b>"}],
    )
    report.add_section(
        "Task overlap",
        "Counting shares heads with math.",
        figure=jaccard_matrix_figure(torch.eye(2), ["counting", "math"]),
        numbers={"nan stays null": float("nan")},
    )
    report.add_section(
        "Attention on the image", "Routing head attends to the dots.", image=Image.new("RGB", (8, 8), "red")
    )
    labels = ["<s>", "img0[r0,c0]", "img0[r0,c1]", "</script>"]
    pattern = torch.softmax(torch.randn(2, 4, 4), dim=-1)
    report.add_section("Patterns L1", "Layer 1 heads.", html=attention_heads_view(pattern, labels, layer=1))
    report.add_section("Patterns L2", "Layer 2 heads.", html=attention_heads_view(pattern, labels, layer=2))
    return report


@pytest.fixture(scope="module")
def page(report, tmp_path_factory) -> str:
    path = report.write(tmp_path_factory.mktemp("report") / "nested" / "report.html")
    return path.read_text(encoding="utf-8")


def test_every_section_title_and_explanation_is_on_the_page(report, page):
    for title in report.section_titles:
        assert f"<h2>{title}</h2>" in page
    assert "Routing head attends to the dots." in page
    assert page.count("<section ") == 6


def test_page_is_offline_with_plotly_inlined_once(page):
    assert not re.search(r"<script[^>]*\bsrc\s*=\s*[\"']?(https?:)?//", page)
    assert not re.search(r"<link[^>]*\bhref\s*=\s*[\"']?(https?:)?//", page)
    assert "unpkg.com" not in page  # circuitsvis's CDN form is never used
    plotly_header = require_plotly_js()[:120]
    assert page.count(plotly_header) == 1  # three figures, one copy of plotly.js
    assert page.count("var CircuitsVis") == 1  # two circuitsvis views, one bundle
    assert page.count("Plotly.newPlot") == 3


def test_images_tables_and_numbers_are_embedded(page):
    assert 'src="data:image/png;base64,' in page
    assert "<th>accuracy</th>" in page and "&lt;b&gt;bold?&lt;/b&gt;" in page
    assert "<dt>top head effect</dt><dd>0.75</dd>" in page


def test_to_dict_has_numbers_per_section(report):
    data = json.loads(json.dumps(report.to_dict(), allow_nan=False))
    assert data["title"] == "Counting circuit"
    assert [s["title"] for s in data["sections"]] == report.section_titles
    assert data["sections"][0]["numbers"] == {"top head effect": 0.75}
    assert data["sections"][2]["numbers"] == {"nan stays null": None}


def test_section_input_errors():
    report = Report("r")
    with pytest.raises(ValueError, match="explanation"):
        report.add_section("t", " ")
    with pytest.raises(TypeError, match="plotly Figure"):
        report.add_section("t", "e", figure="not a figure")
    with pytest.raises(TypeError, match="scalar"):
        report.add_section("t", "e", numbers={"x": torch.ones(3)})
    with pytest.raises(ValueError, match="non-empty list of dicts"):
        report.add_section("t", "e", table=[])
    with pytest.raises(ValueError, match="title"):
        Report("")
    assert len(report) == 0  # failed sections are not added
    plain = report.add_section("Only text", "No figure, no plotly.").to_html()
    assert "plotly.js" not in plain and "<h2>Only text</h2>" in plain


def _inline_scripts(page: str) -> list[str]:
    return re.findall(r"<script[^>]*>(.*?)</script>", page, re.DOTALL)


@pytest.mark.skipif(
    shutil.which("node") is None, reason="node is not installed: cannot syntax-check the scripts"
)
def test_every_inline_script_parses(page, tmp_path):
    scripts = _inline_scripts(page)
    assert len(scripts) == 2 + 3 + 2  # plotly + circuitsvis bundles, 3 figures, 2 views
    for index, script in enumerate(scripts):
        path = tmp_path / f"script_{index}.js"
        path.write_text(script, encoding="utf-8")
        result = subprocess.run(["node", "--check", str(path)], capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, f"script {index} does not parse: {result.stderr[:500]}"


# Recorded before any other script runs; the page body is untouched.
_ERROR_RECORDER = """<script>
window.__errors = [];
window.addEventListener("error", e => window.__errors.push(String(e.message)));
const originalError = console.error;
console.error = (...args) => { window.__errors.push(args.join(" ")); originalError(...args); };
window.addEventListener("load", () => setTimeout(() => {
  document.documentElement.setAttribute("data-errors", JSON.stringify(window.__errors));
  document.documentElement.setAttribute("data-plots", document.querySelectorAll(".main-svg").length);
}, 500));
</script>"""


@pytest.mark.browser
@pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian chromium (/usr/bin/chromium) is not installed")
def test_report_loads_in_headless_chromium_without_console_errors(page, tmp_path):
    path = tmp_path / "report.html"
    path.write_text(page.replace("<head>", "<head>\n" + _ERROR_RECORDER, 1), encoding="utf-8")
    result = subprocess.run(
        [
            str(CHROMIUM),
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--virtual-time-budget=10000",
            "--dump-dom",
            path.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    errors = re.search(r'data-errors="([^"]*)"', result.stdout)
    assert errors is not None, "the page never finished loading"
    assert json.loads(errors[1].replace("&quot;", '"')) == []
    plots = re.search(r'data-plots="(\d+)"', result.stdout)
    assert plots is not None and int(plots[1]) >= 3  # every plotly figure drew its svg

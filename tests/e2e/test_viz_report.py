"""The self-contained HTML report: sections, inlined scripts, offline safety, numbers as JSON."""

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from PIL import Image

from vlens.lens.taxonomy import HEAD_CLASSES
from vlens.viz.circuits import attention_heads_view
from vlens.viz.figures import count_accuracy_figure, jaccard_matrix_figure, layer_head_heatmap
from vlens.viz.report import Report

CHROMIUM = Path("/usr/bin/chromium")
PLOTLY_HEADER = "plotly.js (cartesian - minified)"


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
    assert page.count(PLOTLY_HEADER) == 1  # three figures, one copy of plotly.js (the partial bundle)
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


# ---------------------------------------------------------------- what every figure builder renders
@pytest.fixture(scope="module")
def gallery_path(tmp_path_factory) -> Path:
    """One page with a figure from every vlens builder, each as the demo uses it (one browser run)."""
    from vlens.viz.figures import confusion_matrix_figure, layer_region_figure, logit_lens_figure
    from vlens.viz.geometry import representation_geometry_figure
    from vlens.viz.image_attention import attention_overlay_figure, attention_tiles_figure

    generator = torch.Generator().manual_seed(0)
    same = torch.tensor([[1.0, 0.0, 0.0, 1.0], [1.0, 0.0, 0.0, 1.0], [0.0, 1.0, 1.0, 1.0]])  # text == final
    counts = [1, 2, 3, 4, 5, 6, 7, 8] * 4
    image = Image.new("RGB", (84, 84), "white")
    report = Report("Every figure")
    report.add_section("Lines", "Coinciding curves, intervals.",
                       figure=layer_region_figure(same, ["image", "text", "final", "all"], title="rates",
                                                  lower=same * 0.8, upper=same.clamp(max=0.9) + 0.1))
    report.add_section("Lens", "Integer layer ticks on both panels.",
                       figure=logit_lens_figure([0.1, 0.2, 0.3, 0.9], [6, 5, 3, 1],
                                                probability_interval=([0.05, 0.1, 0.2, 0.8], [0.2, 0.3, 0.4, 1.0]),
                                                rank_interval=([4, 3, 2, 1], [8, 7, 4, 1])))
    report.add_section("Geometry", "Four panels with two-line titles.",
                       figure=representation_geometry_figure(torch.randn(4, 32, 16, generator=generator), counts)
                       .update_layout(width=1000))
    report.add_section("Tiles", "Sixteen heads on one colour scale.",
                       figure=attention_tiles_figure(image, torch.rand(16, 36, generator=generator), (6, 6),
                                                     titles=[f"L{i // 8}H{i % 8}" for i in range(16)]))
    report.add_section("Overlay", "One head over the picture.",
                       figure=attention_overlay_figure(image, torch.rand(36, generator=generator), (6, 6)))
    report.add_section("Jaccard", "Matrix, test-retest bars and the chance line.",
                       figure=jaccard_matrix_figure(torch.tensor([[1.0, 0.3, 0.1], [0.3, 1.0, 0.2], [0.1, 0.2, 1.0]]),
                                                    ["counting", "colour", "shape"], retest=[0.7, 0.1, 0.3],
                                                    chance=0.11))
    report.add_section("Confusion", "Counts.", figure=confusion_matrix_figure([1, 2, 3], ["1", "2", "3", "other"],
                                                                               [[1, 0, 0, 0], [0, 1, 1, 0], [0, 0, 0, 1]]))
    report.add_section("Taxonomy", "Classes.", figure=layer_head_heatmap(classes={(0, 1): "visual grounding"},
                                                                          class_names=HEAD_CLASSES,
                                                                          n_layers=2, n_heads=4))
    report.add_section("Accuracy", "With intervals.",
                       figure=count_accuracy_figure([1, 2, 3], [1.0, 0.8, 0.4], lower=[0.8, 0.5, 0.2],
                                                    upper=[1.0, 0.95, 0.6]),
                       table=[{"count": 1, "accuracy [95% CI]": "1.00 [0.80, 1.00]", "MAE": 0.0}],
                       definitions={"CI": "confidence interval", "MAE": "mean absolute error"})
    return report.write(tmp_path_factory.mktemp("gallery") / "gallery.html")


@pytest.mark.browser
@pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian chromium (/usr/bin/chromium) is not installed")
def test_every_figure_builder_renders_readably_in_chromium(gallery_path):
    from tests.helpers.browser import inspect_page, page_problems

    checks = inspect_page(gallery_path)
    assert page_problems(checks) == []
    figures = {f["section"]: f for f in checks["figures"]}
    assert len(figures) == 9 and all(f["drawn"] for f in figures.values())
    drawn_types = {t["type"] for f in figures.values() for t in f["traces"]}
    assert {"scatter", "heatmap", "image", "bar"} <= drawn_types  # each from the partial bundle
    lens = figures["lens"]["axes"]
    assert lens["xaxis2"]["ticks"] == [0, 1, 2, 3]  # ticks at layers only
    tiles = [t for t in figures["tiles"]["traces"] if t["type"] == "heatmap"]
    assert len(tiles) == 16 and {t["coloraxis"] for t in tiles} == {"coloraxis"}
    assert figures["tiles"]["colorbars"] == 1  # one shared colour bar
    assert len(figures["geometry"]["titles"]) == 4


@pytest.mark.browser
@pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian chromium (/usr/bin/chromium) is not installed")
def test_the_browser_check_catches_what_it_looks_for(tmp_path):
    """A trace type missing from the bundle, ticks between layers, colliding titles and tick labels, private colour
    scales."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    from tests.helpers.browser import inspect_page, page_problems
    from vlens.viz import html as viz_html

    three_d = go.Figure(go.Scatter3d(x=[1], y=[1], z=[1]))
    ticks = go.Figure(go.Scatter(x=[0, 1, 2], y=[1, 2, 3], mode="lines")).update_xaxes(title_text="layer", dtick=0.5)
    crowded = make_subplots(rows=1, cols=2, subplot_titles=["a long subplot title " * 6] * 2)
    for col in (1, 2):
        crowded.add_trace(go.Heatmap(z=[[col, 2], [3, 4 * col]]), row=1, col=col)
    dense = go.Figure(go.Scatter(x=[0, 1], y=[1, 100], mode="lines")).update_layout(height=220)
    dense.update_yaxes(type="log", tickvals=list(range(1, 101)), ticktext=[str(v) for v in range(1, 101)])
    cartesian = viz_html.CARTESIAN_BUNDLE.read_text(encoding="utf-8")
    page = ("<!DOCTYPE html><html><head><meta charset='utf-8'>" + viz_html.inline_script(cartesian) + "</head><body>"
            + "".join(viz_html.figure_div(f, f"f{i}") for i, f in enumerate([three_d, ticks, crowded, dense])) + "</body></html>")
    path = tmp_path / "broken.html"
    path.write_text(page, encoding="utf-8")
    problems = "\n".join(page_problems(inspect_page(path)))
    assert "'scatter3d' is not in the loaded plotly.js bundle" in problems
    assert "ticks between layers" in problems
    assert "titles overlap" in problems
    assert "2 heatmaps with 2 different colour scales" in problems
    assert "y tick labels overlap" in problems


@pytest.mark.browser
@pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian chromium (/usr/bin/chromium) is not installed")
def test_a_command_figure_page_renders_readably_in_chromium(tmp_path):
    """The page every command writes for its figure (vlens.viz.html.write_figure_html, as `vlens logit-lens`)."""
    from tests.helpers.browser import inspect_page, page_problems
    from vlens.viz.figures import logit_lens_figure
    from vlens.viz.html import write_figure_html

    figure = logit_lens_figure([0.1, 0.2, 0.3, 0.9], [150, 40, 3, 1], rank_interval=([90, 20, 2, 1], [400, 80, 6, 1]))
    checks = inspect_page(write_figure_html(figure, tmp_path / "logit_lens.html"))
    assert page_problems(checks) == []
    (drawn,) = checks["figures"]
    assert drawn["drawn"] and drawn["axes"]["xaxis2"]["ticks"] == [0, 1, 2, 3]
    ranks = [round(10 ** t) for t in drawn["axes"]["yaxis2"]["ticks"]]  # a log axis reports log10 values
    assert ranks[:8] == [1, 2, 5, 10, 20, 50, 100, 200]  # 1-2-5 rank ticks

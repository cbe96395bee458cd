"""One way to put plotly into HTML: the vendored cartesian bundle or the installed full one, inlined once."""

import re

import pytest

pytest.importorskip("plotly")

import plotly.graph_objects as go  # noqa: E402

from vlens.viz import html as viz_html  # noqa: E402
from vlens.viz.html import CARTESIAN_TRACES, figure_page, plotly_bundle, write_figure_html  # noqa: E402


def test_the_vendored_bundle_is_the_installed_plotly_js_version_and_licensed():
    version, source = viz_html._cartesian_source()
    assert version == viz_html.installed_plotly_js_version()
    assert "plotly.js (cartesian - minified)" in source[:200]
    assert (viz_html.VENDOR / "plotly-LICENSE.txt").read_text().startswith("MIT License")


def test_cartesian_bundle_for_the_traces_vlens_draws_full_bundle_otherwise(monkeypatch):
    assert {"heatmap", "scatter", "bar", "image"} <= CARTESIAN_TRACES
    assert plotly_bundle({"heatmap", "scatter", "bar", "image"})[0] == "cartesian"
    assert plotly_bundle({"scatter", "scatter3d"})[0] == "full"
    monkeypatch.setattr(viz_html, "installed_plotly_js_version", lambda: "0.0.1")  # another plotly.py
    assert plotly_bundle({"scatter"})[0] == "full"


def test_figure_page_is_offline_with_one_bundle(tmp_path):
    figure = go.Figure(go.Heatmap(z=[[1, 2], [3, 4]])).update_layout(title="t <b>")
    path = write_figure_html(figure, tmp_path / "deep" / "f.html")
    page = path.read_text()
    assert not re.search(r"<script[^>]*\bsrc=", page)  # nothing loaded from a CDN or a file
    assert page.count("plotly.js (cartesian - minified)") == 1
    assert page.count("Plotly.newPlot") == 1 and "<title>t &lt;b&gt;</title>" in page
    assert len(page.encode()) < 1_700_000  # the partial bundle, not the 4.8 MB full one
    full = figure_page(go.Figure(go.Scatter3d(x=[1], y=[1], z=[1])))
    assert "plotly.js (cartesian" not in full and len(full.encode()) > 4_000_000
    with pytest.raises(TypeError, match="plotly Figure"):
        figure_page("not a figure")


def test_command_line_figures_are_offline_pages(tmp_path):
    from vlens.cli.options import write_figure

    path = write_figure(lambda: go.Figure(go.Bar(x=["a"], y=[1])), tmp_path / "figure.html")
    page = path.read_text()
    assert not re.search(r"<script[^>]*\bsrc=", page) and page.count("plotly.js (cartesian - minified)") == 1


def test_ablation_report_with_one_task_draws_no_one_by_one_matrix():
    import torch

    from vlens.ablation import AblationReport, HeadAblation

    result = HeadAblation(task="counting", method="mean", alignment="all", n_examples=4, clean_logprob=-0.1,
                          clean_accuracy=1.0,
                          ablated_logprob=torch.tensor([[-0.5, -0.1], [-0.2, -0.3]]),
                          ablated_accuracy=torch.tensor([[0.5, 1.0], [1.0, 0.75]]))
    page = AblationReport({"counting": result}, top_k=2).html_report().to_html()
    assert "Only one task (counting)" in page
    assert page.count("Plotly.newPlot") == 1  # only the task's damage heatmap


def test_no_other_code_writes_plotly_html():
    """vlens.viz.html is the one way: a `write_html` / `include_plotlyjs` elsewhere would bring back the
    CDN page that draws nothing offline (or a second copy of plotly.js)."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    offenders = [str(path.relative_to(root)) for folder in ("vlens", "benchmarks") for path in (root / folder).rglob("*.py")
                 if path != root / "vlens" / "viz" / "html.py"
                 and re.search(r"\.write_html\(|include_plotlyjs", path.read_text(encoding="utf-8"))]
    assert offenders == [], f"write plotly HTML through vlens.viz.html instead: {offenders}"

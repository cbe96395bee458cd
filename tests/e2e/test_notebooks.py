"""The demos/ notebooks: stored with their outputs (figures also as static PNGs), importing only the
public API, and running top to bottom on the embedded model (nbclient, one kernel each) without
errors or warning blocks.

Running is skipped with the reason when the embedded model's weights are absent (set VLENS_MODEL
to a model folder to run them on another model) or when nbclient / ipykernel are not installed.
The stored outputs are made by `python benchmarks/run_notebooks.py`.
"""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest

DEMOS = Path(__file__).resolve().parents[2] / "demos"
NOTEBOOKS = ["01_quickstart.ipynb", "02_counting_circuit.ipynb", "03_headlens.ipynb", "04_interventions.ipynb"]
TIMEOUT_S = 180  # per cell; each notebook takes 15-40 s on 2 busy cores
# The public API: packages' exports and the submodules their docstrings name as the way in.
PUBLIC_MODULES = {
    "vlens", "vlens.data", "vlens.evaluation", "vlens.patching", "vlens.ablation", "vlens.interventions",
    "vlens.viz", "vlens.utils.stats", "vlens.core.answers", "vlens.utils.provenance", "vlens.zoo",
    "vlens.lens.logit_lens", "vlens.lens.corpus", "vlens.lens.readout", "vlens.lens.translators",
    "vlens.lens.headlens", "vlens.lens.head_scores", "vlens.lens.taxonomy",
}
PLOTLY = "application/vnd.plotly.v1+json"
# never: the report's stages, the command line, the recipes, test support
NOT_PUBLIC = ("vlens.demo", "vlens.cli", "vlens.recipes", "vlens.testing", "vlens.testing.real_vocab")


def _notebook(name):
    nbformat = pytest.importorskip("nbformat")
    notebook = nbformat.read(DEMOS / name, as_version=4)
    nbformat.validate(notebook)
    return notebook


def _code(notebook) -> list:
    return [cell for cell in notebook.cells if cell.cell_type == "code"]


def _problems(notebook) -> list[str]:
    """Errors, stderr blocks (warnings, progress bars) and figures without a static copy."""
    problems = []
    for index, cell in enumerate(_code(notebook)):
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error":
                problems.append(f"cell {index}: {out.get('ename')}: {out.get('evalue')}")
            if out.get("output_type") == "stream" and out.get("name") == "stderr":
                problems.append(f"cell {index}: stderr block: {out.get('text', '')[:200]!r}")
            text = "".join(out.get("text", "")) + "".join(out.get("data", {}).get("text/plain", ""))
            if "Warning" in text:
                problems.append(f"cell {index}: a warning in the output: {text[:200]!r}")
    return problems


def test_every_demo_notebook_is_listed():
    assert sorted(p.name for p in DEMOS.glob("*.ipynb")) == NOTEBOOKS


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_is_stored_with_outputs_and_static_figures(name):
    notebook = _notebook(name)
    code = _code(notebook)
    assert all(cell.get("execution_count") is not None for cell in code), f"{name}: run benchmarks/run_notebooks.py"
    assert [c.execution_count for c in code] == list(range(1, len(code) + 1)), f"{name}: not run top to bottom"
    assert _problems(notebook) == []
    figures = [out for cell in code for out in cell.outputs if PLOTLY in out.get("data", {})]
    assert all("image/png" in out["data"] for out in figures), f"{name}: a figure without its PNG copy"
    assert figures, f"{name} shows no plotly figure"


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_imports_only_the_public_api(name):
    for cell in _code(_notebook(name)):
        for node in ast.walk(ast.parse(cell.source)):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("vlens"):
                assert node.module in PUBLIC_MODULES and not node.module.startswith(NOT_PUBLIC), node.module
                assert not any(alias.name.startswith("_") for alias in node.names), f"{name}: a private name"
            if isinstance(node, ast.Import):
                for alias in node.names:
                    assert not alias.name.startswith("vlens.") or alias.name in PUBLIC_MODULES, alias.name


def _model_available() -> tuple[bool, str]:
    override = os.environ.get("VLENS_MODEL")
    if override:
        return Path(override).is_dir() or override == "random-tiny", f"VLENS_MODEL={override} is not a folder"
    from vlens.zoo import WEIGHTS_FOLDER

    return ((WEIGHTS_FOLDER / "model.safetensors").is_file(),
            f"the embedded model's weights are not in {WEIGHTS_FOLDER} yet (`vlens zoo train` writes them); "
            "set VLENS_MODEL to a model folder to run the notebooks on it")


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_runs_without_errors_or_warnings(name, tmp_path, monkeypatch):
    notebook = _notebook(name)
    nbclient = pytest.importorskip("nbclient", reason="nbclient is not installed (pip install 'vlens[dev]')")
    pytest.importorskip("ipykernel", reason="ipykernel is not installed (pip install 'vlens[dev]')")
    available, reason = _model_available()
    if not available:
        pytest.skip(reason)
    monkeypatch.setenv("VLENS_STATIC_FIGURES", "0")  # the PNG copies are checked in the stored notebook
    for cell in _code(notebook):
        cell.outputs = []
    client = nbclient.NotebookClient(notebook, timeout=TIMEOUT_S, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()  # raises CellExecutionError naming the failing cell (or a timeout)
    assert _problems(notebook) == []

"""The demos/ notebooks run top to bottom on the embedded model (nbclient, one kernel each; set
VLENS_MODEL to a model folder to run them on another model) and use only the public API."""

from __future__ import annotations

import ast
from pathlib import Path

import nbclient
import nbformat
import pytest

DEMOS = Path(__file__).resolve().parents[2] / "demos"
NOTEBOOKS = ["01_quickstart.ipynb", "02_counting_circuit.ipynb", "03_headlens.ipynb", "04_interventions.ipynb"]
TIMEOUT_S = 120  # per cell; each notebook takes 15-20 s on 2 busy cores
# what a user does not import: the report's stages, the command line, the recipes, test support
NOT_PUBLIC = ("vlens.demo", "vlens.cli", "vlens.recipes", "vlens.testing", "vlens.real_vocab")


def test_every_demo_notebook_is_listed_and_stored_without_outputs():
    assert sorted(p.name for p in DEMOS.glob("*.ipynb")) == NOTEBOOKS
    for name in NOTEBOOKS:
        notebook = nbformat.read(DEMOS / name, as_version=4)
        nbformat.validate(notebook)
        code = [cell for cell in notebook.cells if cell.cell_type == "code"]
        assert code, name
        assert all(not cell.get("outputs") and cell.get("execution_count") is None for cell in code), name


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebooks_use_only_the_public_api(name):
    notebook = nbformat.read(DEMOS / name, as_version=4)
    for cell in notebook.cells:
        if cell.cell_type != "code":
            continue
        for node in ast.walk(ast.parse(cell.source)):
            if isinstance(node, ast.ImportFrom):
                modules, names = [node.module or ""], [alias.name for alias in node.names]
            elif isinstance(node, ast.Import):
                modules, names = [alias.name for alias in node.names], []
            else:
                continue
            assert not any(m.startswith(NOT_PUBLIC) for m in modules), f"{name} imports {modules}"
            assert not any(n.startswith("_") for n in names), f"{name} imports private names {names}"


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_runs(name, tmp_path):
    notebook = nbformat.read(DEMOS / name, as_version=4)
    client = nbclient.NotebookClient(notebook, timeout=TIMEOUT_S, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()  # raises CellExecutionError naming the failing cell (or a timeout)
    errors = [out for cell in notebook.cells for out in cell.get("outputs", []) if out.get("output_type") == "error"]
    assert not errors

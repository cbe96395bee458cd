"""The demos/ notebooks run top to bottom on the embedded model (nbclient, one kernel each).

Skipped with the reason when the embedded model's weights are absent (set VLENS_MODEL to a model
folder to run them on another model) or when nbclient / ipykernel are not installed.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

DEMOS = Path(__file__).resolve().parents[2] / "demos"
NOTEBOOKS = ["01_quickstart.ipynb", "02_counting_circuit.ipynb", "03_headlens.ipynb", "04_interventions.ipynb"]
TIMEOUT_S = 120  # per cell; each notebook takes 15-20 s on 2 busy cores


def _model_available() -> tuple[bool, str]:
    override = os.environ.get("VLENS_MODEL")
    if override:
        return Path(override).is_dir() or override == "random-tiny", f"VLENS_MODEL={override} is not a folder"
    from vlens.zoo import WEIGHTS_FOLDER

    return ((WEIGHTS_FOLDER / "model.safetensors").is_file(),
            f"the embedded model's weights are not in {WEIGHTS_FOLDER} yet (`vlens zoo train` writes them); "
            "set VLENS_MODEL to a model folder to run the notebooks on it")


def test_every_demo_notebook_is_listed_and_stored_without_outputs():
    nbformat = pytest.importorskip("nbformat")
    assert sorted(p.name for p in DEMOS.glob("*.ipynb")) == NOTEBOOKS
    for name in NOTEBOOKS:
        notebook = nbformat.read(DEMOS / name, as_version=4)
        nbformat.validate(notebook)
        code = [cell for cell in notebook.cells if cell.cell_type == "code"]
        assert code, name
        assert all(not cell.get("outputs") and cell.get("execution_count") is None for cell in code), name


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_runs(name, tmp_path):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient", reason="nbclient is not installed (pip install 'vlens[dev]')")
    pytest.importorskip("ipykernel", reason="ipykernel is not installed (pip install 'vlens[dev]')")
    available, reason = _model_available()
    if not available:
        pytest.skip(reason)
    notebook = nbformat.read(DEMOS / name, as_version=4)
    client = nbclient.NotebookClient(notebook, timeout=TIMEOUT_S, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()  # raises CellExecutionError naming the failing cell (or a timeout)
    errors = [out for cell in notebook.cells for out in cell.get("outputs", []) if out.get("output_type") == "error"]
    assert not errors

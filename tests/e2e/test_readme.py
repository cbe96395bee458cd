"""The README's quick tour runs as written, on the embedded model."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_quick_tour_runs():
    from vlens.zoo import WEIGHTS_FOLDER

    if not (WEIGHTS_FOLDER / "model.safetensors").exists():
        pytest.skip("embedded model weights are absent")
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    assert blocks, "README has no python code block"
    namespace: dict = {}
    exec(compile(blocks[0], "README.md", "exec"), namespace)
    model, inputs = namespace["model"], namespace["inputs"]
    assert namespace["patched"].shape == (1, inputs.seq_len, model.cfg.d_vocab)
    assert inputs.regions.image_grid[0] == [(6, 6)]
    assert all(not hp.fwd_hooks for hp in model.hook_dict.values())

"""The names the docs give resolve, and the method packages export their functions."""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOTTED = re.compile(r"`(vlens(?:\.[A-Za-z_][A-Za-z0-9_]*)+)")
NOT_PYTHON = {"vlens.adapters"}  # the entry-point group's name (CONTRIBUTING.md), no module


def resolve(name: str) -> bool:
    """Whether `name` is a module or an attribute path below one."""
    parts = name.split(".")
    for split in range(len(parts), 0, -1):
        try:
            found = importlib.import_module(".".join(parts[:split]))
        except ImportError:
            continue
        for attribute in parts[split:]:
            if not hasattr(found, attribute):
                return False
            found = getattr(found, attribute)
        return True
    return False


def test_every_vlens_name_in_the_docs_resolves():
    files = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]
    names = {(f.name, n) for f in files for n in DOTTED.findall(f.read_text(encoding="utf-8"))}
    assert len(names) > 50
    broken = sorted((f, n) for f, n in names if n not in NOT_PYTHON and not resolve(n))
    assert not broken, broken


def test_vlens_lens_exports_its_functions_and_keeps_its_submodules():
    from vlens.lens import HeadLens, Translators, classify_heads, compute_head_scores, logit_lens
    from vlens.lens import headlens as headlens_module
    from vlens.lens.logit_lens import logit_lens as the_function

    assert logit_lens is the_function and callable(logit_lens) and logit_lens.__name__ == "logit_lens"
    assert headlens_module.HeadLens is HeadLens and importlib.import_module("vlens.lens.translators").Translators \
        is Translators
    assert classify_heads.__module__ == "vlens.lens.taxonomy"
    assert compute_head_scores.__module__ == "vlens.lens.head_scores"
    import vlens.lens

    for name in vlens.lens.__all__:
        assert getattr(vlens.lens, name) is not None, name


def test_import_vlens_loads_no_method_package():
    code = ("import sys, vlens; vlens.__version__; "
            "print([m for m in sys.modules if m.startswith(('vlens.lens', 'vlens.patching', 'torch'))])")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "[]"

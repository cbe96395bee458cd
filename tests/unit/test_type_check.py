"""The static checks are part of CI: `.ci/run` runs ruff, lint-imports and mypy (configured in
pyproject.toml) where a failure stops the run, and mypy's configuration does report a type error."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_ci_runs_the_static_checks_where_a_failure_fails_ci():
    lines = [line.split("#")[0].strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert "set -euo pipefail" in lines
    assert "mypy" in lines, "the CI script does not run the type checker"
    mypy, pytest = lines.index("mypy"), next(i for i, line in enumerate(lines) if "pytest" in line)
    # before `set +e` (which lets pytest's status be inspected), so a non-zero exit ends CI
    ruff = lines.index("ruff check vlens tests benchmarks")
    assert ruff < lines.index("lint-imports") < mypy < lines.index("set +e") < pytest


def test_the_mypy_configuration_reports_type_errors(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text(
        "import some_untyped_package_that_is_not_installed\n\n\n"  # ignore_missing_imports: no error
        "def count(text: str) -> int:\n    return text\n\n\n"  # the error mypy must report
        "def untyped(x):\n    return x + 'a'\n"  # unannotated: not checked in the default mode
    )
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"), "--cache-dir",
         str(tmp_path / "cache"), str(probe)],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 1, result.stdout + result.stderr
    assert 'probe.py:5: error: Incompatible return value type (got "str", expected "int")' in result.stdout
    assert "Found 1 error in 1 file" in result.stdout

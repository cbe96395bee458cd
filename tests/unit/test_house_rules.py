"""The house rules (pyproject.toml, [tool.importlinter]) hold for vlens, and the contracts catch
what they are for: an import cycle (also through a function-level import), a private name
imported from another module, a first-party import inside a function, a layer break."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def lint_imports(*args: str, cwd: Path = ROOT, extra_path: Path | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    paths = [str(p) for p in (extra_path, ROOT) if p is not None]
    env["PYTHONPATH"] = os.pathsep.join(paths + [env.get("PYTHONPATH", "")])
    command = [sys.executable, "-c", "import sys; from importlinter.cli import lint_imports_command; "
               "sys.exit(lint_imports_command())", *args]
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def test_vlens_keeps_every_contract():
    result = lint_imports()
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "0 broken" in result.stdout


def test_the_contracts_catch_each_kind_of_violation(tmp_path):
    package = tmp_path / "probe"
    package.mkdir()
    files = {
        "__init__.py": "",
        "low.py": "def helper():\n    return 1\n\n\ndef _secret():\n    return 2\n",
        # a private name across modules, and a lazy import that closes a cycle with `high`
        "mid.py": "from probe.low import _secret, helper\n\n\ndef run():\n    from probe import high\n\n"
                  "    return high.value() + helper() + _secret()\n",
        "high.py": "from probe.mid import run\n\n\ndef value():\n    return 3\n",
        # a lower layer reaching up
        "base.py": "from probe.high import value\n",
    }
    for name, text in files.items():
        (package / name).write_text(text)
    config = tmp_path / ".importlinter"
    config.write_text(textwrap.dedent("""\
        [importlinter]
        root_package = probe
        contract_types =
            no_private_imports: tools.import_contracts.NoPrivateImportsContract
            imports_at_top: tools.import_contracts.ImportsAtTopContract

        [importlinter:contract:layers]
        name = layers
        type = layers
        containers =
            probe
        layers =
            high
            mid
            low : base

        [importlinter:contract:cycles]
        name = cycles
        type = acyclic_siblings
        ancestors =
            probe

        [importlinter:contract:private]
        name = private names
        type = no_private_imports
        packages =
            probe

        [importlinter:contract:top]
        name = imports at top
        type = imports_at_top
        packages =
            probe
        """))
    result = lint_imports("--config", str(config), cwd=tmp_path, extra_path=tmp_path)
    out = result.stdout
    assert result.returncode != 0
    assert "4 broken" in out, out
    assert "probe.mid:1 imports a private name of another module" in out
    assert "probe.mid:5 imports inside a function" in out
    assert "probe.base is not allowed to import probe.high" in out


def test_the_package_root_holds_only_sub_packages():
    """The folders are the layers: a loose module at the root would belong to no layer."""
    loose = sorted(p.name for p in (ROOT / "vlens").glob("*.py") if p.name not in {"__init__.py", "__main__.py"})
    assert not loose, f"move {loose} into the sub-package of its layer (CONTRIBUTING.md, 'Layers')"
    packages = {p.name for p in (ROOT / "vlens").iterdir() if (p / "__init__.py").is_file()}
    assert {"core", "utils", "testing", "cli"} <= packages

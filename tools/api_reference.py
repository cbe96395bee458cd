"""Build the API reference from the docstrings with pdoc, every pdoc warning an error (CI: .ci/run).

    python -m tools.api_reference [OUT]          # default docs/api (HTML, not committed)

The reference covers `vlens` (its lazily imported top-level names resolved first) and every
public sub-package; a docstring reference or an `__all__` name that does not resolve, or a module
that fails to import, fails the build.
"""

from __future__ import annotations

import importlib
import sys
import warnings
from pathlib import Path

PACKAGES = ("vlens", "vlens.core", "vlens.utils", "vlens.patching", "vlens.lens", "vlens.ablation", "vlens.circuits",
            "vlens.interventions", "vlens.training", "vlens.evaluation", "vlens.routing", "vlens.sae",
            "vlens.parallel", "vlens.datasets", "vlens.data", "vlens.viz", "vlens.studies", "vlens.testing",
            "vlens.zoo")


def build(out: Path) -> list[str]:
    """Render the reference into `out`; returns pdoc's warnings (empty: a clean build)."""
    import pdoc
    import pdoc.render


    for package in PACKAGES:  # lazily imported names (vlens, vlens.zoo): on the module, where pdoc reads them
        module = importlib.import_module(package)
        for name in getattr(module, "__all__", ()):
            module.__dict__.setdefault(name, getattr(module, name))
    pdoc.render.configure(docformat="google", show_source=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pdoc.pdoc(*PACKAGES, output_directory=out)
    return [f"{w.filename}:{w.lineno}: {w.message}" for w in caught if "pdoc" in Path(w.filename).parts]


def main(argv: list[str]) -> int:
    out = Path(argv[0] if argv else "docs/api")
    problems = build(out)
    for line in problems:
        print(f"api reference: {line}", file=sys.stderr)
    if problems:
        print(f"api reference: {len(problems)} warnings (treated as errors)", file=sys.stderr)
        return 1
    print(f"api reference: {out / 'index.html'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Two import-linter contract types that the built-in ones cannot express.

- ``no_private_imports``: no module imports a ``_private`` name from another module
  (``from vlens.patching.pairs import _record_image``). A helper two modules need is made
  public in the lower of the two layers instead.
- ``imports_at_top``: no first-party import inside a function or method. Lazy imports hide
  cycles and layer breaks from the graph; only optional extras (third-party) may be imported
  lazily. `allow` lists the rare first-party exceptions as "importer -> imported"; `exempt`
  names packages left out (the command modules, which import per command).

Both read the package's source with `ast`, so a multi-line import is checked whole. Registered
in pyproject.toml (`[tool.importlinter] contract_types`) and run by `lint-imports`.
"""

from __future__ import annotations

import ast
import importlib.util
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from grimp import ImportGraph
from importlinter.application import output
from importlinter.domain import fields
from importlinter.domain.contract import Contract, ContractCheck


@dataclass(frozen=True)
class Found:
    importer: str
    imported: str
    line: int
    text: str


def _package_files(package: str) -> Iterator[tuple[str, Path]]:
    """(module name, file) for every module of an installed or importable package."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(f"{package} is not an importable package")
    root = Path(next(iter(spec.submodule_search_locations)))
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        yield ".".join(parts), path


def _is_package(path: Path) -> bool:
    return path.name == "__init__.py"


def _absolute(module: str, path: Path, node: ast.ImportFrom) -> str:
    """The absolute module an ImportFrom reads from (resolving relative imports)."""
    if not node.level:
        return node.module or ""
    base = module.split(".")
    if not _is_package(path):
        base = base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _inside_function(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    def visit(node: ast.AST, in_function: bool) -> Iterator[ast.Import | ast.ImportFrom]:
        for child in ast.iter_child_nodes(node):
            inside = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if in_function and isinstance(child, (ast.Import, ast.ImportFrom)):
                yield child
            yield from visit(child, inside)

    yield from visit(tree, False)


def _render(check: ContractCheck, what: str) -> None:
    for found in check.metadata["found"]:
        output.print_error(f"{found.importer}:{found.line} {what}: {found.text}")
        output.new_line()


class NoPrivateImportsContract(Contract):
    """No module imports another module's `_private` names (or a `_private` module of another package)."""

    type_name = "no_private_imports"
    packages = fields.ListField(subfield=fields.StringField())

    def check(self, graph: ImportGraph, verbose: bool) -> ContractCheck:
        found = []
        for package in self.packages:  # type: ignore[attr-defined]
            for module, path in _package_files(package):
                tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
                for node in ast.walk(tree):
                    if isinstance(node, ast.ImportFrom):
                        source = _absolute(module, path, node)
                        names = [a.name for a in node.names]
                        if source != module and any(_private(n) for n in names):
                            found.append(Found(module, source, node.lineno, ast.unparse(node)))
                        elif any(_private(part) for part in source.split(".")) and \
                                not module.startswith(source.rsplit(".", 1)[0]):
                            found.append(Found(module, source, node.lineno, ast.unparse(node)))
                    elif isinstance(node, ast.Import):
                        for alias in node.names:
                            parts = alias.name.split(".")
                            if any(_private(p) for p in parts) and not module.startswith(alias.name.rsplit(".", 1)[0]):
                                found.append(Found(module, alias.name, node.lineno, ast.unparse(node)))
        return ContractCheck(kept=not found, metadata={"found": found})

    def render_broken_contract(self, check: ContractCheck) -> None:
        _render(check, "imports a private name of another module")


class ImportsAtTopContract(Contract):
    """First-party imports sit at module top, never inside a function (except `allow`)."""

    type_name = "imports_at_top"
    packages = fields.ListField(subfield=fields.StringField())
    exempt = fields.ListField(subfield=fields.StringField(), required=False)
    allow = fields.ListField(subfield=fields.StringField(), required=False)

    def check(self, graph: ImportGraph, verbose: bool) -> ContractCheck:
        allowed = {tuple(part.strip() for part in entry.split("->")) for entry in (self.allow or [])}  # type: ignore[attr-defined]
        exempt = tuple(self.exempt or ())  # type: ignore[attr-defined]
        found = []
        for package in self.packages:  # type: ignore[attr-defined]
            for module, path in _package_files(package):
                if any(module == e or module.startswith(e + ".") for e in exempt):
                    continue
                tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
                for node in _inside_function(tree):
                    if isinstance(node, ast.ImportFrom):
                        targets = [_absolute(module, path, node)]
                    else:
                        targets = [alias.name for alias in node.names]
                    for target in targets:
                        first_party = target.split(".")[0] == package
                        if first_party and (module, target) not in allowed:
                            found.append(Found(module, target, node.lineno, ast.unparse(node)))
        return ContractCheck(kept=not found, metadata={"found": found})

    def render_broken_contract(self, check: ContractCheck) -> None:
        _render(check, "imports inside a function (move it to the module top)")

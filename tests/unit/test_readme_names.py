"""Every vlens / TransformerLens name the README's Python blocks use exists: what they import, the attributes
they read from modules (`vlens.viz.attention_patterns`, `transformer_lens.utilities...`) and the attributes
they read from objects whose class the code tells (`circuit.plot`, `graph.edges_into`, `model.prepare`: the
class a called function's return annotation names). Resolved by importing, without running the blocks (the
embedded-model tour runs in tests/e2e/test_readme.py). A block that needs a GPU is skipped, saying so."""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import re
import types
from pathlib import Path
from typing import Any

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"
ROOTS = ("vlens", "transformer_lens")
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), re.S)
GPU = re.compile(r"""device\s*=\s*["']cuda""")


class Instance:
    """A value the code made by calling something whose return annotation names this class."""

    def __init__(self, cls: type):
        self.cls = cls


def instance_attributes(cls: type) -> set[str]:
    """Attributes an instance of `cls` has: the class's, dataclass fields, annotations, `self.x =` in its code."""
    names = set(dir(cls))
    for klass in cls.__mro__:
        names |= set(getattr(klass, "__annotations__", {}))
        if dataclasses.is_dataclass(klass):
            names |= {f.name for f in dataclasses.fields(klass)}
        try:
            names |= set(re.findall(r"self\.(\w+)\s*(?::[^=\n]*)?=", inspect.getsource(klass)))
        except (OSError, TypeError):
            pass
    return names


def returned_class(function: Any) -> type | None:
    """The class `function(...)` returns, from its return annotation (a class called: the class)."""
    if isinstance(function, type):
        return function
    hint = inspect.get_annotations(function).get("return") if callable(function) else None
    if isinstance(hint, str):  # postponed annotations: read in the function's module (a name it imports
        module = inspect.getmodule(function)  # only for type checking stays unresolved, and tells nothing)
        try:
            hint = eval(hint, vars(module) if module else {})  # noqa: S307 - the library's own annotation text
        except Exception:  # noqa: BLE001
            return None
    return hint if isinstance(hint, type) and hint.__module__.split(".")[0] in ROOTS else None


class Checker(ast.NodeVisitor):
    def __init__(self) -> None:
        self.env: dict[str, Any] = {}
        self.missing: list[str] = []
        self.checked: list[str] = []

    # ------------------------------------------------------------------ names bound by imports
    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if alias.name.split(".")[0] not in ROOTS:
                continue
            try:
                module = importlib.import_module(alias.name)
            except ImportError as error:
                self.missing.append(f"import {alias.name}: {error}")
                continue
            self.checked.append(alias.name)
            self.env[alias.asname or alias.name.split(".")[0]] = (
                module if alias.asname else importlib.import_module(alias.name.split(".")[0]))

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if not node.module or node.module.split(".")[0] not in ROOTS:
            return
        module = importlib.import_module(node.module)
        for alias in node.names:
            value = getattr(module, alias.name, None)
            if value is None:
                try:
                    value = importlib.import_module(f"{node.module}.{alias.name}")
                except ImportError:
                    self.missing.append(f"from {node.module} import {alias.name}")
                    continue
            self.checked.append(f"{node.module}.{alias.name}")
            self.env[alias.asname or alias.name] = value

    # ------------------------------------------------------------------ values the code makes
    def visit_Assign(self, node: ast.Assign) -> None:
        self.generic_visit(node)
        made = self.value_of(node.value)
        for target in node.targets:
            if isinstance(target, ast.Name):
                if made is None:
                    self.env.pop(target.id, None)  # rebound to something this check cannot tell
                else:
                    self.env[target.id] = made

    def value_of(self, node: ast.expr) -> Any:
        if isinstance(node, ast.Call):
            function = self.resolve(node.func)
            if function is None or isinstance(function, Instance):
                return None
            cls = returned_class(function)
            return Instance(cls) if cls is not None else None
        return self.resolve(node)

    # ------------------------------------------------------------------ attribute chains
    def visit_Attribute(self, node: ast.Attribute) -> None:
        self.resolve(node)

    def resolve(self, node: ast.expr) -> Any:
        """The object `node` names (None when this check cannot tell), recording a name that is missing."""
        if isinstance(node, ast.Name):
            return self.env.get(node.id)
        if isinstance(node, ast.Call):
            self.generic_visit(node)
            return self.value_of(node)
        if not isinstance(node, ast.Attribute):
            self.generic_visit(node)
            return None
        base = self.resolve(node.value)
        if base is None:
            return None
        where = ast.unparse(node)
        if isinstance(base, Instance):
            if node.attr not in instance_attributes(base.cls):
                self.missing.append(f"{where}: {base.cls.__qualname__} has no attribute {node.attr!r}")
            else:
                self.checked.append(f"{base.cls.__qualname__}.{node.attr}")
            return None  # what an attribute holds is not followed further
        try:
            value = getattr(base, node.attr)
        except AttributeError:
            if not isinstance(base, types.ModuleType):
                self.missing.append(f"{where}: no attribute {node.attr!r}")
                return None
            try:
                value = importlib.import_module(f"{base.__name__}.{node.attr}")
            except ImportError:
                self.missing.append(f"{where}: {base.__name__} has no {node.attr!r}")
                return None
        except Exception as error:  # noqa: BLE001 - e.g. TransformerLens's ImportError for removed names
            self.missing.append(f"{where}: {error}")
            return None
        self.checked.append(where)
        return value


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_every_name_a_readme_block_uses_exists(index):
    block = BLOCKS[index]
    code = "\n".join(line.split("#", 1)[0] for line in block.splitlines())
    if GPU.search(code):
        pytest.skip("the block runs on a GPU (device='cuda'); its names are the CPU blocks' too")
    checker = Checker()
    checker.visit(ast.parse(block))
    assert not checker.missing, checker.missing
    assert checker.checked, "the block uses no vlens / TransformerLens name: nothing was checked"


def test_the_checker_catches_a_missing_name():
    checker = Checker()
    checker.visit(ast.parse(
        "import vlens\nimport transformer_lens\nfrom vlens.circuits import extract_circuit\n"
        "circuit = extract_circuit(model, pairs)\ncircuit.edges\ncircuit.wires\ncircuit.plot()\n"
        "transformer_lens.utils.get_act_name\nvlens.no_such_name\nfrom vlens.data import nothing_here\n"))
    text = " ".join(checker.missing)
    assert "'wires'" in text and "utils" in text and "no_such_name" in text and "nothing_here" in text
    assert "Circuit.edges" in checker.checked
    assert "Circuit.plot" in checker.checked

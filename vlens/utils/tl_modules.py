"""The parts of TransformerLens vlens builds on, without the cost of TransformerLens's package imports.

vlens uses four TransformerLens modules: ``hook_points`` (HookPoint), ``HookedRootModule``,
``ActivationCache`` and ``FactoredMatrix``. Importing any of them the ordinary way first runs
``transformer_lens/__init__.py``, which imports the whole library (the model bridge, evals,
``datasets``, ``pandas``, ...): about 1.2 s, as much as the rest of ``import vlens.core.model``
(benchmarks/RESULTS.md, import cost).

So the first vlens import loads those modules with TransformerLens's *packages* (``transformer_lens``,
``transformer_lens.utilities``, ...) created but their ``__init__`` not yet run. Such a package
(a `DeferredPackage`) answers a name its ``__init__`` imports from a submodule by importing just
that submodule (the same object the ``__init__`` would bind), and runs its real ``__init__`` (its
parent's first, as a plain import does) the first time anything else is asked of it: another name,
``dir()``, or importing a submodule not yet loaded. ``import transformer_lens`` after ``import vlens``
so behaves as it always does; only its cost moves to where it is used. If TransformerLens is already
imported, or anything in this goes wrong, the modules are imported the ordinary way.
"""

from __future__ import annotations

import ast
import importlib
import importlib.abc
import importlib.machinery
import re
import sys
import threading
import types
from collections.abc import Iterator
from contextlib import contextmanager
from importlib import metadata
from pathlib import Path
from typing import Any

__all__ = ["TRANSFORMER_LENS_RANGE", "ActivationCache", "DeferredPackage", "FactoredMatrix", "HookPoint",
           "HookedRootModule", "Slice", "check_transformer_lens_version", "get_act_name"]

# The TransformerLens releases whose hook points and ActivationCache vlens is tested on: 3.9 is the newest
# that SAELens accepts (it pins transformer-lens < 4), 4.x the newest line.
TRANSFORMER_LENS_RANGE = ((3, 9), (5, 0))

_ROOT = "transformer_lens"
# what vlens imports (each loads the light submodules it needs itself)
_NEEDED = ("hook_points", "HookedRootModule", "ActivationCache", "FactoredMatrix", "utilities.slice",
           "utilities.components_utils")
_lock = threading.RLock()
_deferring = False  # True while vlens imports its modules: a submodule import then does not run a package's __init__


def check_transformer_lens_version(version: str | None = None) -> None:
    """Raise ImportError, naming the supported range, when the installed transformer-lens is outside it."""
    if version is None:
        try:
            version = metadata.version("transformer-lens")
        except metadata.PackageNotFoundError:
            return  # importing it fails below with Python's own message
    match = re.match(r"(\d+)\.(\d+)", version)
    (low, high) = TRANSFORMER_LENS_RANGE
    if match is None or not low <= (int(match[1]), int(match[2])) < high:
        raise ImportError(
            f"vlens needs transformer-lens >={low[0]}.{low[1]},<{high[0]} (its hook points and ActivationCache); "
            f"transformer-lens {version} is installed. Install a supported one: "
            f"pip install 'transformer-lens>={low[0]}.{low[1]},<{high[0]}' (with sae-lens, which pins "
            "transformer-lens < 4, pip then picks 3.9)."
        )


def _init_names(init_file: str, package: str) -> dict[str, tuple[str, str | None]]:
    """name -> (submodule, attribute or None for the submodule itself) of each top-level ``from ... import``
    in a package's __init__ that reads from one of its own submodules."""
    tree = ast.parse(Path(init_file).read_text(encoding="utf-8"))
    names: dict[str, tuple[str, str | None]] = {}
    for node in tree.body:  # top level only: imports under try / functions are the __init__'s own business
        if not isinstance(node, ast.ImportFrom):
            continue
        if node.level == 1:
            base = f"{package}.{node.module}" if node.module else package
        elif node.level == 0 and node.module and node.module.startswith(package + "."):
            base = node.module
        else:
            continue
        for alias in node.names:
            if alias.name == "*":
                continue
            bound = alias.asname or alias.name
            names[bound] = (f"{base}.{alias.name}", None) if base == package else (base, alias.name)
    return names


class DeferredPackage(types.ModuleType):
    """A TransformerLens package whose ``__init__`` runs when first needed (see the module docstring)."""

    @property  # type: ignore[override]
    def __path__(self) -> list[str]:
        # the import system reads a package's __path__ to import a submodule not loaded yet: the package's
        # __init__ runs first (as a plain import would have), except while vlens loads what it needs
        if "_vlens_path" not in self.__dict__:
            raise AttributeError("__path__")  # being created (importlib asks before it sets it)
        if not _deferring:
            run_init(self)
            return self.__dict__["__path__"]
        return self.__dict__["_vlens_path"]

    @__path__.setter
    def __path__(self, value: list[str]) -> None:
        self.__dict__["_vlens_path"] = value

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name not in ("__all__", "__getattr__", "__dir__"):
            raise AttributeError(name)  # probes (__wrapped__, ...) do not load the library
        names = self.__dict__.get("_vlens_names")
        if names is None:
            names = _init_names(self.__dict__["__file__"], self.__name__)
            self.__dict__["_vlens_names"] = names
        if name in names:  # the object the __init__ would bind, from its own submodule
            (submodule, attribute) = names[name]
            module = importlib.import_module(submodule)
            value = module if attribute is None else getattr(module, attribute)
        else:
            run_init(self)
            value = getattr(self, name)
        self.__dict__[name] = value
        return value

    def __dir__(self) -> list[str]:
        run_init(self)
        return dir(self)


def run_init(module: types.ModuleType) -> None:
    """Run a deferred package's real ``__init__`` (its parent's first) in the same module object; once."""
    with _lock:
        if type(module) is not DeferredPackage:
            return
        parent = sys.modules.get(module.__name__.rpartition(".")[0])
        if isinstance(parent, DeferredPackage):
            run_init(parent)
            if type(module) is not DeferredPackage:
                return  # the parent's __init__ imported this package (and so ran its __init__)
        namespace = module.__dict__
        path = namespace.pop("_vlens_path")
        namespace.pop("_vlens_names", None)
        loader = namespace.pop("_vlens_loader")
        module.__class__ = types.ModuleType  # type: ignore[assignment]
        namespace["__path__"] = path
        namespace["__loader__"] = loader
        module.__spec__.loader = loader  # type: ignore[union-attr]
        loader.exec_module(module)


class _DeferredLoader(importlib.abc.Loader):
    def __init__(self, real: importlib.abc.Loader):
        self.real = real

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return DeferredPackage(spec.name)

    def exec_module(self, module: types.ModuleType) -> None:
        module.__dict__["_vlens_loader"] = self.real  # the __init__ itself runs later (run_init)


class _DeferringFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != _ROOT and not fullname.startswith(_ROOT + "."):
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.submodule_search_locations is None or spec.loader is None:
            return None  # a plain module loads as usual
        spec.loader = _DeferredLoader(spec.loader)
        return spec


@contextmanager
def _deferring_packages() -> Iterator[None]:
    global _deferring
    finder = _DeferringFinder()
    sys.meta_path.insert(0, finder)
    _deferring = True
    try:
        yield
    finally:
        _deferring = False
        sys.meta_path.remove(finder)
        for module in list(sys.modules.values()):
            if isinstance(module, DeferredPackage):
                # forget what the import system bound while loading (a submodule named like the class its
                # __init__ binds, e.g. ActivationCache): every name is answered again as the __init__ would
                for key in [k for k in module.__dict__ if not k.startswith("_")]:
                    del module.__dict__[key]


def _load() -> None:
    if _ROOT in sys.modules:
        for name in _NEEDED:
            importlib.import_module(f"{_ROOT}.{name}")
        return
    try:
        with _lock, _deferring_packages():
            for name in _NEEDED:
                importlib.import_module(f"{_ROOT}.{name}")
    except Exception:  # noqa: BLE001 - any surprise in a TransformerLens release: its ordinary import
        for name in [n for n in sys.modules if n == _ROOT or n.startswith(_ROOT + ".")]:
            del sys.modules[name]
        for name in _NEEDED:
            importlib.import_module(f"{_ROOT}.{name}")


check_transformer_lens_version()
_load()

from transformer_lens.ActivationCache import ActivationCache  # noqa: E402
from transformer_lens.FactoredMatrix import FactoredMatrix  # noqa: E402
from transformer_lens.hook_points import HookPoint  # noqa: E402
from transformer_lens.HookedRootModule import HookedRootModule  # noqa: E402
from transformer_lens.utilities.components_utils import get_act_name  # noqa: E402
from transformer_lens.utilities.slice import Slice  # noqa: E402

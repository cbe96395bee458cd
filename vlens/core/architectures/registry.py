"""The open registry of model families: HF class name (and family name) -> adapter class.

A family registers itself with the class decorator `vlens.register_adapter`. The built-in families
do so in their own modules (one file each in this package), and so does a third-party package:

    import vlens

    @vlens.register_adapter
    class MyVLMAdapter(vlens.ArchitectureAdapter):
        hf_class_names = ("MyVLMForConditionalGeneration",)
        family = "my_vlm"
        ...

Families are found through the entry-point group ``vlens.adapters``; vlens's own pyproject.toml
lists the built-in modules there, and a plugin package lists its own:

    [project.entry-points."vlens.adapters"]
    my_vlm = "my_package.vlens_adapter"            # a module whose adapters use @register_adapter
    # or   = "my_package.vlens_adapter:MyVLMAdapter"  (an adapter class, registered when loaded)

Entry points are loaded on the first lookup, not at import. Every module of this package is
imported then too, so a source checkout whose installed metadata predates a new built-in file
still finds it. A plugin that fails to import is skipped with a warning naming it; the built-in
families keep working.
"""

from __future__ import annotations

import importlib
import logging
import pkgutil
from collections.abc import Callable
from importlib.metadata import entry_points
from typing import TypeVar, overload

from torch import nn

from vlens.core.architectures.base import ArchitectureAdapter
from vlens.utils.errors import UserInputError

logger = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "vlens.adapters"
# modules of this package that hold no family
_NOT_FAMILIES = {"base", "registry"}

A = TypeVar("A", bound=type[ArchitectureAdapter])

_by_class_name: dict[str, type[ArchitectureAdapter]] = {}
_by_family: dict[str, type[ArchitectureAdapter]] = {}
_discovered = False


@overload
def register_adapter(adapter: A, *, replace: bool = False) -> A: ...
@overload
def register_adapter(adapter: None = None, *, replace: bool = False) -> Callable[[A], A]: ...
def register_adapter(adapter=None, *, replace: bool = False):
    """Register an `ArchitectureAdapter` subclass for its `hf_class_names` and `family`.

    Use as a class decorator (``@register_adapter`` or ``@register_adapter(replace=True)``) or
    call it on a class. A name already registered to another adapter is an error unless
    ``replace=True`` (e.g. to override a built-in family with your own adapter). Returns the class.
    """
    if adapter is None:
        return lambda cls: register_adapter(cls, replace=replace)
    if not (isinstance(adapter, type) and issubclass(adapter, ArchitectureAdapter)):
        raise UserInputError(f"register_adapter takes an ArchitectureAdapter subclass, got {adapter!r}")
    if not adapter.hf_class_names or not adapter.family:
        raise UserInputError(f"{adapter.__qualname__}: set hf_class_names (the HF class names it converts, e.g. "
                             "('LlavaForConditionalGeneration',)) and family (a short name, e.g. 'llava') "
                             "before registering it")
    keys = [(_by_class_name, name) for name in adapter.hf_class_names] + [(_by_family, adapter.family)]
    for table, key in keys:
        held = table.get(key)
        if held is not None and not _same_class(held, adapter) and not replace:
            raise UserInputError(f"{key!r} is already registered to {held.__module__}.{held.__qualname__}; "
                                 f"{adapter.__module__}.{adapter.__qualname__} cannot take it (pass replace=True "
                                 "to override it)")
    for table, key in keys:
        table[key] = adapter
    return adapter


def _same_class(a: type, b: type) -> bool:
    # a module imported twice (e.g. as a script and as a module) defines the class twice
    return a is b or (a.__module__, a.__qualname__) == (b.__module__, b.__qualname__)


def discover_adapters(reload: bool = False) -> None:
    """Import the built-in family modules and every ``vlens.adapters`` entry point (once)."""
    global _discovered
    if _discovered and not reload:
        return
    _discovered = True
    package = importlib.import_module(__package__ or "vlens.core.architectures")
    for module in pkgutil.iter_modules(package.__path__):
        if module.name not in _NOT_FAMILIES and not module.name.startswith("_"):
            importlib.import_module(f"{package.__name__}.{module.name}")
    for point in entry_points(group=ENTRY_POINT_GROUP):
        try:
            loaded = point.load()
        except Exception as error:  # a broken plugin must not take the built-in families down with it
            logger.warning("vlens adapter plugin %r (%s) could not be loaded and is skipped: %s: %s",
                           point.name, point.value, type(error).__name__, error)
            continue
        if isinstance(loaded, type) and issubclass(loaded, ArchitectureAdapter):
            register_adapter(loaded, replace=_same_class(_by_family.get(loaded.family, loaded), loaded))


def unregister_adapter(family: str) -> type[ArchitectureAdapter]:
    """Remove a registered family (its family name and HF class names); returns its adapter class."""
    adapter = _by_family.pop(family, None)
    if adapter is None:
        raise UserInputError(f"no family {family!r} is registered (registered: {', '.join(_by_family)})")
    for name in [n for n, a in _by_class_name.items() if a is adapter]:
        del _by_class_name[name]
    return adapter


def registered_adapters() -> dict[str, type[ArchitectureAdapter]]:
    """{family: adapter class} of every registered family, in registration order."""
    discover_adapters()
    return dict(_by_family)


def supported_architectures() -> list[str]:
    """The HF class names vlens can convert (not those of a family registered only to say why it is refused)."""
    discover_adapters()
    return [name for name, adapter in _by_class_name.items() if adapter.refusal is None]


def adapter_class_for(name_or_model: nn.Module | type | str) -> type[ArchitectureAdapter]:
    """The adapter class for an HF model, its class, its class name or a family name."""
    discover_adapters()
    if isinstance(name_or_model, str):
        names = [name_or_model]
    else:
        cls = name_or_model if isinstance(name_or_model, type) else type(name_or_model)
        names = [c.__name__ for c in cls.__mro__]  # a user's subclass of an HF class converts as its base
    for name in names:
        adapter = _by_class_name.get(name) or _by_family.get(name)
        if adapter is not None:
            return adapter
    raise UserInputError(
        f"Unsupported architecture {names[0]!r}. vlens supports: {', '.join(supported_architectures())} "
        f"(families: {', '.join(_by_family)}). To add a family, write an ArchitectureAdapter and register it "
        "with @vlens.register_adapter (CONTRIBUTING.md, 'Adding an architecture')."
    )


def adapter_for(name_or_model: nn.Module | type | str) -> ArchitectureAdapter:
    """An adapter instance for an HF model, its class, its class name or a family name (see
    `adapter_class_for`); an unsupported one is a `UserInputError` listing the supported ones."""
    return adapter_class_for(name_or_model)()


def resolve_adapter(adapter: ArchitectureAdapter | type[ArchitectureAdapter] | str | None,
                    hf_model: nn.Module | type | str) -> ArchitectureAdapter:
    """The adapter `HookedVLM` uses: the one given (an instance, a class, or a registered family / HF
    class name), else the registered one for `hf_model`."""
    if adapter is None:
        return adapter_for(hf_model)
    if isinstance(adapter, ArchitectureAdapter):
        return adapter
    if isinstance(adapter, type) and issubclass(adapter, ArchitectureAdapter):
        return adapter()
    if isinstance(adapter, str):
        return adapter_for(adapter)
    raise UserInputError(f"adapter must be an ArchitectureAdapter (instance or class) or a registered family "
                         f"name, got {type(adapter).__name__}; to pass a processor, use processor=...")


__all__ = [
    "ENTRY_POINT_GROUP",
    "adapter_class_for",
    "adapter_for",
    "discover_adapters",
    "register_adapter",
    "registered_adapters",
    "resolve_adapter",
    "supported_architectures",
    "unregister_adapter",
]

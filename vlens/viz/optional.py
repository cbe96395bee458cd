"""Lazy imports of the optional `viz` extra (plotly, circuitsvis) with one clear error."""

from __future__ import annotations

import importlib
from types import ModuleType

_INSTALL_HINT = 'pip install "vlens[viz]"'


def _import_or_explain(module_name: str, feature: str) -> ModuleType:
    try:
        return importlib.import_module(module_name)
    except ImportError as error:
        raise ImportError(
            f"{feature} needs the optional package '{module_name.split('.')[0]}'. "
            f"Install the visualisation extra: {_INSTALL_HINT}"
        ) from error


def require_plotly() -> ModuleType:
    """Return `plotly.graph_objects`, or raise an ImportError naming the `viz` extra."""
    return _import_or_explain("plotly.graph_objects", "This plotly figure")


def require_make_subplots():
    """Return `plotly.subplots.make_subplots` (same error as `require_plotly`)."""
    return _import_or_explain("plotly.subplots", "This plotly figure").make_subplots


def require_circuitsvis_attention() -> ModuleType:
    """Return `circuitsvis.attention`, or raise an ImportError naming the `viz` extra."""
    return _import_or_explain("circuitsvis.attention", "This circuitsvis view")

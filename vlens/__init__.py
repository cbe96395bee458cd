"""vlens: mechanistic interpretability for vision-language models.

Quick start::

    import vlens
    model = vlens.load()                       # the embedded tiny Qwen2.5-VL
    model = vlens.load_model("Qwen/Qwen2.5-VL-7B-Instruct")   # any --model spec (see vlens.specs)
    inputs = model.prepare(images=[img], prompts=["How many dots are there?"])
    logits, cache = model.run_with_cache(inputs)

Attributes are imported lazily so that light sub-packages (`vlens.data`, the CLI) start
without loading torch and transformers.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_LAZY = {
    "HookedVLM": "vlens.model",
    "HookedVisionLanguageModel": "vlens.model",
    "VLMConfig": "vlens.config",
    "VLMInputs": "vlens.inputs",
    "TokenRegions": "vlens.inputs",
    "act_name": "vlens.hooks",
    "load_model": "vlens.specs",
}

__all__ = [
    "HookedVLM",
    "HookedVisionLanguageModel",
    "TokenRegions",
    "VLMConfig",
    "VLMInputs",
    "act_name",
    "load",
    "load_model",
]

if TYPE_CHECKING:
    from vlens.config import VLMConfig
    from vlens.hooks import act_name
    from vlens.inputs import TokenRegions, VLMInputs
    from vlens.model import HookedVisionLanguageModel, HookedVLM
    from vlens.specs import load_model


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'vlens' has no attribute {name!r}")


def load(*args: Any, **kwargs: Any) -> HookedVLM:
    """The embedded default model (a tiny trained Qwen2.5-VL) as a `HookedVLM`; see `vlens.zoo`."""
    from vlens.zoo import load as zoo_load

    return zoo_load(*args, **kwargs)

"""vlens: mechanistic interpretability for vision-language models.

Quick start::

    import vlens
    model = vlens.load()                       # the embedded tiny Qwen2.5-VL
    model = vlens.load_model("Qwen/Qwen2.5-VL-7B-Instruct")   # any --model spec (see vlens.zoo.specs)
    inputs = model.prepare(images=[img], prompts=["How many dots are there?"])
    logits, cache = model.run_with_cache(inputs)

Sub-packages are the layers: `vlens.core` (the model and its parts, family adapters), `vlens.utils`
(errors, results, statistics), the methods (`vlens.patching`, `vlens.lens`, `vlens.ablation`, ...),
`vlens.viz`, `vlens.zoo` (where models come from), `vlens.testing` (tiny models of every family),
`vlens.cli`. Attributes here are imported lazily, so that light sub-packages (`vlens.data`, the
CLI) start without loading torch and transformers.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_LAZY = {
    "HookedVLM": "vlens.core.model",
    "HookedVisionLanguageModel": "vlens.core.model",
    "VLMConfig": "vlens.core.config",
    "VLMInputs": "vlens.core.inputs",
    "TokenRegions": "vlens.core.inputs",
    "act_name": "vlens.core.hooks",
    "load_model": "vlens.zoo.specs",
    "ArchitectureAdapter": "vlens.core.architectures",
    "ImageFeatures": "vlens.core.architectures",
    "register_adapter": "vlens.core.architectures",
    "adapter_for": "vlens.core.architectures",
    "registered_adapters": "vlens.core.architectures",
    "supported_architectures": "vlens.core.architectures",
    "UserInputError": "vlens.utils.errors",
    "load_result": "vlens.utils.results",
    "load_cache": "vlens.core.cache",
    "Result": "vlens.utils.results",
    "SweepOptions": "vlens.parallel.options",
}

__all__ = [
    "ArchitectureAdapter",
    "HookedVLM",
    "HookedVisionLanguageModel",
    "ImageFeatures",
    "SweepOptions",
    "TokenRegions",
    "UserInputError",
    "VLMConfig",
    "VLMInputs",
    "act_name",
    "adapter_for",
    "Result",
    "load",
    "load_cache",
    "load_model",
    "load_result",
    "register_adapter",
    "registered_adapters",
    "supported_architectures",
]

if TYPE_CHECKING:
    from vlens.core.architectures import (
        ArchitectureAdapter,
        ImageFeatures,
        adapter_for,
        register_adapter,
        registered_adapters,
        supported_architectures,
    )
    from vlens.core.cache import load_cache
    from vlens.core.config import VLMConfig
    from vlens.core.hooks import act_name
    from vlens.core.inputs import TokenRegions, VLMInputs
    from vlens.core.model import HookedVisionLanguageModel, HookedVLM
    from vlens.parallel.options import SweepOptions
    from vlens.utils.errors import UserInputError
    from vlens.utils.results import Result, load_result
    from vlens.zoo.specs import load_model


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value  # imported once (and visible to tools that read the module's namespace)
        return value
    raise AttributeError(f"module 'vlens' has no attribute {name!r}")


def load(*args: Any, **kwargs: Any) -> HookedVLM:
    """The embedded default model (a tiny trained Qwen2.5-VL) as a `HookedVLM`; see `vlens.zoo`."""
    from vlens.zoo import load as zoo_load

    return zoo_load(*args, **kwargs)

"""The registry of supported architectures: HF class name -> adapter.

Adding a family: write `vlens/architectures/<family>.py` with an `ArchitectureAdapter`
subclass and add one line to `ADAPTERS` below.
"""

from __future__ import annotations

from torch import nn

from vlens.architectures.base import ArchitectureAdapter
from vlens.architectures.llava import LlavaAdapter
from vlens.architectures.qwen2_vl import Qwen2_5_VLAdapter, Qwen2VLAdapter
from vlens.architectures.qwen3_vl import Qwen3VLAdapter

ADAPTERS: list[type[ArchitectureAdapter]] = [
    Qwen2VLAdapter,
    Qwen2_5_VLAdapter,
    Qwen3VLAdapter,
    LlavaAdapter,
]


def supported_architectures() -> list[str]:
    return [name for adapter in ADAPTERS for name in adapter.hf_class_names]


def adapter_for(hf_model_or_class_name: nn.Module | str) -> ArchitectureAdapter:
    """The adapter for an HF model (or its class name); a clear error if unsupported."""
    name = hf_model_or_class_name if isinstance(hf_model_or_class_name, str) else type(hf_model_or_class_name).__name__
    for adapter in ADAPTERS:
        if name in adapter.hf_class_names:
            return adapter()
    raise ValueError(
        f"Unsupported architecture {name!r}. vlens supports: {', '.join(supported_architectures())}. "
        "To add a family, see CONTRIBUTING.md ('Adding an architecture')."
    )

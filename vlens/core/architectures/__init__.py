"""Architecture adapters (one file per family) and their open registry (`registry`)."""

from vlens.core.architectures.base import ArchitectureAdapter, DecoderParts, ImageFeatures
from vlens.core.architectures.registry import (
    adapter_class_for,
    adapter_for,
    register_adapter,
    registered_adapters,
    resolve_adapter,
    supported_architectures,
    unregister_adapter,
)

__all__ = [
    "ArchitectureAdapter",
    "DecoderParts",
    "ImageFeatures",
    "adapter_class_for",
    "adapter_for",
    "register_adapter",
    "registered_adapters",
    "resolve_adapter",
    "supported_architectures",
    "unregister_adapter",
]

"""Architecture adapters and their registry."""

from vlens.architectures.base import ArchitectureAdapter, ImageFeatures
from vlens.architectures.registry import adapter_for, supported_architectures

__all__ = ["ArchitectureAdapter", "ImageFeatures", "adapter_for", "supported_architectures"]

"""A light image+text processor for when HF's `AutoProcessor` cannot be built (`SimpleVLProcessor`).

The class lives with the family adapters (`vlens.core.architectures.simple_processor`), whose own
processors build on it (Mistral 3's `PixtralImageTextProcessor`); this module is its public home.
"""

from vlens.core.architectures.simple_processor import SimpleVLProcessor

__all__ = ["SimpleVLProcessor"]

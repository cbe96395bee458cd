"""The hooked decoder's building blocks, one module per file.

Every component is built around the HF model's own parameters (the same `nn.Parameter`
objects: moved, not copied), so converting a 7B checkpoint needs no second copy.
"""

from vlens.core.components.attention import Attention
from vlens.core.components.block import TransformerBlock
from vlens.core.components.embed import Embed
from vlens.core.components.mlp import GatedMLP
from vlens.core.components.rms_norm import RMSNorm, RMSNormPre
from vlens.core.components.rotary import RotaryEmbedding, apply_rotary
from vlens.core.components.unembed import Unembed
from vlens.core.components.vision import HookedVisionTower

__all__ = [
    "Attention",
    "Embed",
    "GatedMLP",
    "HookedVisionTower",
    "RMSNorm",
    "RMSNormPre",
    "RotaryEmbedding",
    "TransformerBlock",
    "Unembed",
    "apply_rotary",
]

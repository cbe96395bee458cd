"""The hooked decoder's building blocks, one module per file.

Every component is built around the HF model's own parameters (the same `nn.Parameter`
objects: moved, not copied), so converting a 7B checkpoint needs no second copy.
"""

from vlens.core.components.attention import Attention
from vlens.core.components.block import TransformerBlock
from vlens.core.components.embed import Embed, ScaledEmbed
from vlens.core.components.gated_attention import GatedAttention
from vlens.core.components.gated_deltanet import DeltaRuleKernels, GatedDeltaNet
from vlens.core.components.mlp import FusedGatedMLP, GatedMLP
from vlens.core.components.moe import GroupedSigmoidMoEMLP, MoEMLP
from vlens.core.components.rms_norm import RMSNorm, RMSNormPre, ZeroCenteredRMSNorm, ZeroCenteredRMSNormPre
from vlens.core.components.rotary import LayerTypeRotary, RotaryEmbedding, apply_rotary
from vlens.core.components.sandwich_block import SandwichBlock
from vlens.core.components.short_conv import ShortConv
from vlens.core.components.unembed import Unembed
from vlens.core.components.vision import HookedVisionTower

__all__ = [
    "Attention",
    "DeltaRuleKernels",
    "Embed",
    "GatedAttention",
    "GatedDeltaNet",
    "FusedGatedMLP",
    "GatedMLP",
    "HookedVisionTower",
    "LayerTypeRotary",
    "GroupedSigmoidMoEMLP",
    "MoEMLP",
    "RMSNorm",
    "RMSNormPre",
    "RotaryEmbedding",
    "SandwichBlock",
    "ScaledEmbed",
    "ShortConv",
    "TransformerBlock",
    "Unembed",
    "ZeroCenteredRMSNorm",
    "ZeroCenteredRMSNormPre",
    "apply_rotary",
]

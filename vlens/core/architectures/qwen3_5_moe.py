"""Qwen3.5-MoE: Qwen3.5's hybrid decoder (Gated DeltaNet + gated attention) with a sparse MoE MLP in
every layer: routed experts (top-k of `num_experts`, renormalised weights) plus one shared expert
whose output is scaled by sigmoid(shared_expert_gate(x)). The MLP becomes `MoEMLP` (`sparse_moe`)
with the shared expert as `mlp.shared_expert` (a `GatedMLP`) and its gate at `mlp.hook_shared_gate`.
"""

from __future__ import annotations

from vlens.core.architectures.qwen3_5 import Qwen3_5Adapter
from vlens.core.architectures.registry import register_adapter
from vlens.core.architectures.sparse_moe import SparseMoEAdapterMixin


@register_adapter
class Qwen3_5MoeAdapter(SparseMoEAdapterMixin, Qwen3_5Adapter):
    hf_class_names = ("Qwen3_5MoeForConditionalGeneration",)
    family = "qwen3_5_moe"

"""Qwen3-VL-MoE: the Qwen3-VL decoder with sparse mixture-of-experts MLPs.

Everything but the MLP is Qwen3-VL's (q/k norm, interleaved M-RoPE, DeepStack, positions from
HF's `get_rope_index`), so the adapter extends `Qwen3VLAdapter`. A decoder layer's MLP is a
`Qwen3VLMoeTextSparseMoeBlock` (router `mlp.gate`, fused experts `mlp.experts`) where
`(layer + 1) % decoder_sparse_step == 0` and the layer is not in `mlp_only_layers`, else a dense
MLP; the sparse ones become `MoEMLP` (hooks on the router logits, the chosen experts, their
weights and each expert's output), around HF's parameters in place (`sparse_moe`).
"""

from __future__ import annotations

from vlens.core.architectures.qwen3_vl import Qwen3VLAdapter
from vlens.core.architectures.registry import register_adapter
from vlens.core.architectures.sparse_moe import SparseMoEAdapterMixin


@register_adapter
class Qwen3VLMoeAdapter(SparseMoEAdapterMixin, Qwen3VLAdapter):
    """Qwen3-VL with sparse MoE MLPs: Qwen3-VL's bookkeeping, `MoEMLP` where HF has a sparse block."""

    hf_class_names = ("Qwen3VLMoeForConditionalGeneration",)
    family = "qwen3_vl_moe"

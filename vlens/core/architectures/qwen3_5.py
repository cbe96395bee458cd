"""Qwen3.5: a hybrid decoder of Gated DeltaNet (linear attention) and gated softmax attention layers.

Differences from Qwen3-VL, and where each is handled:
- `text_config.layer_types`: "linear_attention" layers (`layer.linear_attn`, a Gated DeltaNet) become
  `GatedDeltaNet` (heads = value heads, `attn.hook_z` before out_proj, hooks on q/k/v after the
  short convolution, beta, g, the recurrent state), run with HF's own delta-rule and convolution
  functions; "full_attention" layers (`layer.self_attn`) become `GatedAttention`: q_proj also
  yields a per-head output gate (sigmoid), applied before o_proj (`attn.hook_output_gate`).
- norms are zero-centred ((1 + w) * x / rms, in fp32): `ZeroCenteredRMSNorm`, and the final norm's
  1 + w is folded into W_U (`norm_weight_offset = 1`). The q/k norms are HF's modules themselves.
- partial rotary (`partial_rotary_factor`): HF's rotary module returns cos / sin for the rotated
  dimensions only; `apply_rotary` rotates those and passes the rest through.
- no DeepStack; the vision tower is Qwen3-VL's kind (16 px patches, merger), wrapped the same way.
- linear-attention layers mask padding by zeroing the padding inputs, as HF does: a row's state
  starts at its first real token, so left padding changes nothing at the real positions.
Positions, placeholder counts, decoding deltas and the chat format are Qwen3-VL's (HF's
`get_rope_index`).
"""

from __future__ import annotations

import sys

from vlens.core.architectures.base import HFModule
from vlens.core.architectures.qwen3_vl import Qwen3VLAdapter
from vlens.core.architectures.registry import register_adapter
from vlens.core.components import Attention, DeltaRuleKernels, GatedAttention, GatedDeltaNet, ShortConv
from vlens.core.config import VLMConfig
from vlens.utils.errors import UserInputError


def delta_rule_kernels(hf_linear_attn: HFModule) -> DeltaRuleKernels:
    """The functions HF's Gated DeltaNet forward calls, taken from its own module (torch fallbacks, or
    the kernels HF resolved at import)."""
    module = sys.modules[type(hf_linear_attn).__module__]
    return DeltaRuleKernels(chunk_rule=module.torch_chunk_gated_delta_rule,
                            recurrent_rule=module.torch_recurrent_gated_delta_rule,
                            conv=module.causal_conv1d_fn, conv_update=module.causal_conv1d_update)


@register_adapter
class Qwen3_5Adapter(Qwen3VLAdapter):
    """Qwen3.5 (dense MLPs): Qwen3-VL's bookkeeping with the hybrid decoder (module docstring)."""

    hf_class_names = ("Qwen3_5ForConditionalGeneration",)
    family = "qwen3_5"
    norm_weight_offset = 1.0

    def build_config(self, hf_model: HFModule) -> VLMConfig:
        cfg = super().build_config(hf_model)
        text = hf_model.config.text_config
        cfg.d_mlp = int(getattr(text, "intermediate_size", None) or getattr(text, "moe_intermediate_size", None) or 0)
        cfg.layer_types = list(text.layer_types)
        cfg.linear_n_heads = text.linear_num_value_heads
        cfg.linear_d_head = text.linear_value_head_dim
        cfg.linear_n_key_heads = text.linear_num_key_heads
        cfg.linear_d_key = text.linear_key_head_dim
        cfg.linear_conv_kernel = text.linear_conv_kernel_dim
        cfg.n_deepstack_layers = 0
        return cfg

    def query_projection(self, hf_layer: HFModule):
        """Full-attention layers only: q_proj writes each head's query and its output gate."""
        if getattr(hf_layer, "self_attn", None) is None:
            raise UserInputError("this decoder layer is a linear-attention (Gated DeltaNet) layer: it has no q_proj")
        return hf_layer.self_attn.q_proj

    def query_norm(self, hf_layer: HFModule):
        sa = getattr(hf_layer, "self_attn", None)
        return None if sa is None else getattr(sa, "q_norm", None)

    def build_attention(self, cfg: VLMConfig, layer: int, hf_layer: HFModule) -> Attention | GatedDeltaNet | ShortConv:
        if cfg.is_linear_attention(layer):
            return GatedDeltaNet(cfg, layer, hf_layer.linear_attn, delta_rule_kernels(hf_layer.linear_attn))
        sa = hf_layer.self_attn
        return GatedAttention(cfg, layer, sa.q_proj, sa.k_proj, sa.v_proj, sa.o_proj, q_norm=sa.q_norm,
                              k_norm=sa.k_norm)

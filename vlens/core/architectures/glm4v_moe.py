"""GLM-4.5V (`Glm4vMoeForConditionalGeneration`): GLM-4.1V's vision side and positions with a mixture-of-experts
decoder.

Differences from GLM-4.1V (`Glm4vAdapter`), and where each is handled:
- Block: two norms (the core `TransformerBlock`: ``input_layernorm``, ``post_attention_layernorm``), q/k/v biases
  from `attention_bias`, `head_dim` from the config.
- Rotary: HF's module (M-RoPE sections over `partial_rotary_factor` of each head), halves rotated together
  (Llama's pairs, `rope_adjacent_pairs` off), each frequency's table repeated as [freqs, freqs].
- MLP: dense (separate gate / up / down) on the first `first_k_dense_replace` layers, then a
  `GroupedSigmoidMoEMLP` around HF's router (sigmoid scores, `e_score_correction_bias`, `n_group` /
  `topk_group`, `norm_topk_prob`, `routed_scaling_factor`), its fused experts and its shared experts (one
  `GatedMLP` of size moe_intermediate_size x n_shared_experts, added without a gate: `mlp.hook_shared_out`).
  Hooks as docs/moe.md lists them; `mlp.hook_router_logits` are the logits before the sigmoid.
"""

from __future__ import annotations

from vlens.core.architectures.base import ArchitectureAdapter, HFModule
from vlens.core.architectures.glm4v import Glm4vAdapter
from vlens.core.architectures.registry import register_adapter
from vlens.core.architectures.sparse_moe import is_sparse_moe, moe_config
from vlens.core.components import Attention, GatedMLP, GroupedSigmoidMoEMLP, MoEMLP
from vlens.core.components.block import TransformerBlock
from vlens.core.config import VLMConfig


@register_adapter
class Glm4vMoeAdapter(Glm4vAdapter):
    hf_class_names = ("Glm4vMoeForConditionalGeneration",)
    family = "glm4v_moe"

    def build_config(self, hf_model: HFModule) -> VLMConfig:
        cfg = super().build_config(hf_model)
        text = hf_model.config.text_config
        cfg.d_head = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
        cfg.rope_adjacent_pairs = False
        cfg = moe_config(cfg, text, self.decoder_layers(hf_model))
        cfg.n_experts = int(text.n_routed_experts)
        cfg.d_shared_expert = int(text.moe_intermediate_size) * int(text.n_shared_experts)
        return cfg

    def build_block(self, cfg: VLMConfig, layer: int, hf_layer: HFModule) -> TransformerBlock:
        return ArchitectureAdapter.build_block(self, cfg, layer, hf_layer)

    def build_attention(self, cfg: VLMConfig, layer: int, hf_layer: HFModule) -> Attention:
        sa = hf_layer.self_attn
        return Attention(cfg, layer, sa.q_proj, sa.k_proj, sa.v_proj, sa.o_proj)

    def build_mlp(self, cfg: VLMConfig, layer: int, hf_layer: HFModule) -> GatedMLP | MoEMLP:
        mlp = hf_layer.mlp
        if not is_sparse_moe(mlp):
            return GatedMLP(mlp.gate_proj, mlp.up_proj, mlp.down_proj, cfg.act_fn)
        shared = mlp.shared_experts
        return GroupedSigmoidMoEMLP(mlp.gate, mlp.experts, top_k=mlp.gate.top_k,
                                    normalize_top_k=bool(mlp.gate.norm_topk_prob),
                                    shared_expert=GatedMLP(shared.gate_proj, shared.up_proj, shared.down_proj,
                                                           cfg.act_fn),
                                    ungated_shared=True)

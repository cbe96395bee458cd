"""What the mixture-of-experts families share: finding HF's sparse MoE blocks and wrapping them.

`SparseMoEAdapterMixin` goes before a dense family's adapter in the bases (Qwen3-VL-MoE on
Qwen3-VL, Qwen3.5-MoE on Qwen3.5): it adds the MoE fields to the config and builds a hooked
`MoEMLP` wherever HF's layer holds a sparse block, the dense MLP elsewhere.
"""

from __future__ import annotations

from vlens.core.architectures.base import ArchitectureAdapter, HFModule
from vlens.core.components import GatedMLP, MoEMLP
from vlens.core.config import VLMConfig


def is_sparse_moe(hf_mlp: HFModule) -> bool:
    """True for an HF sparse MoE block (a router `gate` with a 2-D weight and top_k, an `experts` module)."""
    gate = getattr(hf_mlp, "gate", None)
    return hasattr(hf_mlp, "experts") and getattr(getattr(gate, "weight", None), "ndim", 0) == 2 \
        and hasattr(gate, "top_k")


def build_moe_mlp(cfg: VLMConfig, hf_mlp: HFModule, normalize_top_k: bool = True) -> MoEMLP:
    """A hooked `MoEMLP` around an HF sparse MoE block: router `gate`, `experts`, and the shared
    expert with its gate where the block has one (`shared_expert`, `shared_expert_gate`)."""
    shared = getattr(hf_mlp, "shared_expert", None)
    shared_mlp = None if shared is None else GatedMLP(shared.gate_proj, shared.up_proj, shared.down_proj, cfg.act_fn)
    return MoEMLP(hf_mlp.gate, hf_mlp.experts, top_k=hf_mlp.gate.top_k, normalize_top_k=normalize_top_k,
                  shared_expert=shared_mlp, shared_gate=getattr(hf_mlp, "shared_expert_gate", None))


def moe_config(cfg: VLMConfig, text: HFModule, hf_layers) -> VLMConfig:
    """Fill the mixture-of-experts fields of `cfg` from the HF text config and decoder layers."""
    cfg.moe_layers = [layer for layer, hf_layer in enumerate(hf_layers) if is_sparse_moe(hf_layer.mlp)]
    cfg.n_experts = int(getattr(text, "num_experts", 0) or 0)
    cfg.n_experts_per_token = int(getattr(text, "num_experts_per_tok", 0) or 0)
    cfg.d_expert = int(getattr(text, "moe_intermediate_size", 0) or 0)
    cfg.d_shared_expert = int(getattr(text, "shared_expert_intermediate_size", 0) or 0)
    return cfg


class SparseMoEAdapterMixin(ArchitectureAdapter):
    """MoE fields in the config, `MoEMLP` for HF's sparse blocks (the dense family's MLP elsewhere).

    `normalize_top_k`: whether the family's router renormalises its top-k weights to sum to 1 (the
    Qwen3-VL-MoE and Qwen3.5-MoE routers always do; a config's `norm_topk_prob`, where it has one, decides).
    """

    def build_config(self, hf_model: HFModule) -> VLMConfig:
        cfg = super().build_config(hf_model)  # type: ignore[safe-super]  # the family's adapter, next in the MRO
        return moe_config(cfg, hf_model.config.text_config, self.decoder_layers(hf_model))

    def build_mlp(self, cfg: VLMConfig, layer: int, hf_layer: HFModule) -> GatedMLP | MoEMLP:
        if is_sparse_moe(hf_layer.mlp):
            text = self.text_config_of(hf_layer)
            return build_moe_mlp(cfg, hf_layer.mlp, normalize_top_k=bool(getattr(text, "norm_topk_prob", True)))
        return super().build_mlp(cfg, layer, hf_layer)

    def text_config_of(self, hf_layer: HFModule):
        """The text config the HF layer was built from (its experts module keeps it), or None."""
        return getattr(hf_layer.mlp.experts, "config", None)

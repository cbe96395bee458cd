"""What an architecture adapter provides: the only family-specific code in vlens.

An adapter turns one HF `...ForConditionalGeneration` class into the pieces `HookedVLM`
runs: a `VLMConfig`, hooked decoder blocks built around the HF parameters, a hooked vision
tower, image features, position ids and the prompt format. Adding a family is a subclass in
its own file plus one line in `registry.py` (see CONTRIBUTING.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from vlens.components import (
    Attention,
    Embed,
    GatedMLP,
    HookedVisionTower,
    RMSNorm,
    RMSNormPre,
    RotaryEmbedding,
    TransformerBlock,
    Unembed,
)
from vlens.config import VLMConfig


@dataclass
class ImageFeatures:
    """Output of the vision side for a batch.

    embeds: [n_image_tokens, d_model], all images concatenated, in placeholder order.
    deepstack: per early decoder layer, [n_image_tokens, d_model] added after that layer
        (Qwen3-VL), else empty.
    """

    embeds: Tensor
    deepstack: list[Tensor]


@dataclass
class DecoderParts:
    embed: Embed
    blocks: list[TransformerBlock]
    ln_final: RMSNormPre
    unembed: Unembed
    rotary: RotaryEmbedding


class ArchitectureAdapter:
    """Base class; subclasses set `hf_class_names` and override the family-specific hooks."""

    hf_class_names: tuple[str, ...] = ()
    family: str = ""

    # ---- conversion ----
    def build_config(self, hf_model: nn.Module) -> VLMConfig:
        raise NotImplementedError

    def language_model(self, hf_model: nn.Module) -> nn.Module:
        """The HF text decoder (has embed_tokens, layers, norm, rotary_emb)."""
        return hf_model.model.language_model

    def build_decoder(self, hf_model: nn.Module, cfg: VLMConfig) -> DecoderParts:
        """Hooked modules around the HF parameters (Llama/Qwen layer layout)."""
        lm = self.language_model(hf_model)
        blocks = [self.build_block(cfg, layer, hf_layer) for layer, hf_layer in enumerate(lm.layers)]
        return DecoderParts(
            embed=Embed(lm.embed_tokens),
            blocks=blocks,
            # the final norm's weight is applied by the unembedding (an effective W_U, as after
            # TransformerLens's fold_ln), with HF's arithmetic
            ln_final=RMSNormPre(cfg.eps),
            unembed=Unembed(hf_model.lm_head, lm.norm.weight, ln_final_source=lm.norm),
            rotary=RotaryEmbedding(lm.rotary_emb, cfg.rope_kind),
        )

    def build_block(self, cfg: VLMConfig, layer: int, hf_layer: nn.Module) -> TransformerBlock:
        sa, mlp = hf_layer.self_attn, hf_layer.mlp
        attn = Attention(
            cfg, layer, sa.q_proj, sa.k_proj, sa.v_proj, sa.o_proj,
            q_norm=getattr(sa, "q_norm", None), k_norm=getattr(sa, "k_norm", None),
        )
        return TransformerBlock(
            layer,
            ln1=RMSNorm(hf_layer.input_layernorm.weight, cfg.eps, source=hf_layer.input_layernorm),
            attn=attn,
            ln2=RMSNorm(hf_layer.post_attention_layernorm.weight, cfg.eps,
                        source=hf_layer.post_attention_layernorm),
            mlp=GatedMLP(mlp.gate_proj, mlp.up_proj, mlp.down_proj, cfg.act_fn),
        )

    def build_vision(self, hf_model: nn.Module) -> HookedVisionTower:
        raise NotImplementedError

    # ---- running ----
    def encode_images(self, vision: HookedVisionTower, inputs) -> ImageFeatures:
        raise NotImplementedError

    def image_token_counts(self, cfg: VLMConfig, inputs) -> tuple[list[int], list[tuple[int, int]]]:
        """Per image (in order): number of placeholder tokens and merged grid (rows, cols)."""
        raise NotImplementedError

    def mm_token_type_ids(self, cfg: VLMConfig, input_ids: Tensor) -> Tensor:
        """0 for text, 1 for image placeholders, 2 for video placeholders (HF's convention)."""
        types = torch.zeros_like(input_ids, dtype=torch.int)
        if cfg.image_token_id is not None:
            types[input_ids == cfg.image_token_id] = 1
        if cfg.video_token_id is not None:
            types[input_ids == cfg.video_token_id] = 2
        return types

    def position_ids(self, hf_model: nn.Module, inputs) -> tuple[Tensor, Tensor]:
        """Prefill position ids (family layout) and per-row deltas for decoding."""
        raise NotImplementedError

    def decode_position_ids(self, attention_mask: Tensor, n_new: int, deltas: Tensor) -> Tensor:
        """Position ids of the last `n_new` tokens during cached decoding."""
        raise NotImplementedError

    # ---- prompts ----
    def image_placeholder(self) -> str:
        """The text that stands for one image in a prompt (before processor expansion)."""
        raise NotImplementedError

    def fallback_chat_prompt(self, question: str, n_images: int) -> str:
        """The family's chat format, used when the processor has no chat template."""
        raise NotImplementedError

    def check_inputs(self, cfg: VLMConfig, inputs) -> None:
        """Raise a clear error for inputs the family cannot run."""


def token_id_list(value) -> list[int]:
    """Token id(s) as a list of ints: None -> [], an int, a list / tuple or a tensor of ids."""
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return [int(v) for v in value]
    if isinstance(value, torch.Tensor):
        return [int(v) for v in value.flatten().tolist()]
    return [int(value)]

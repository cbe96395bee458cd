"""LoRA adapters on a `HookedVLM`'s self-attention projections, with peft.

The hooked attention owns the HF `q_proj`/`k_proj`/`v_proj`/`o_proj` `nn.Linear` modules
(shared with `model.hf_model`). peft replaces them *in our module tree only*: the LoRA layer
wraps the very same base `nn.Linear`, while `model.hf_model` keeps pointing at the plain
module, so the HF model stays clean (and its frozen base weights stay shared).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from torch import nn

from vlens.utils.errors import UserInputError

if TYPE_CHECKING:
    from vlens.core.model import HookedVLM


ATTENTION_PROJECTIONS: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")
ADAPTER_NAME = "default"


def lora_target_regex(
    projections: Sequence[str] = ATTENTION_PROJECTIONS, layers: Sequence[int] | None = None
) -> str:
    """peft `target_modules` regex for our decoder attention (never the vision tower)."""
    layer_part = r"\d+" if layers is None else "(?:" + "|".join(str(int(layer)) for layer in layers) + ")"
    return rf"blocks\.{layer_part}\.attn\.(?:{'|'.join(projections)})"


def add_lora(
    model: HookedVLM,
    rank: int = 64,
    alpha: float | None = None,
    dropout: float = 0.0,
    projections: Sequence[str] = ATTENTION_PROJECTIONS,
    layers: Sequence[int] | None = None,
):
    """Inject LoRA (peft) into the decoder attention projections; freeze everything else.

    alpha: LoRA scaling numerator (scale = alpha / rank); default 2 * rank (the paper is silent;
    2r is the common choice). Returns the peft `LoraConfig`. The model is changed in place.
    """
    from peft import LoraConfig, inject_adapter_in_model

    refusal = getattr(model.adapter, "lora_refusal", None)
    if refusal:
        raise UserInputError(f"LoRA is not supported for {model.adapter.family}: {refusal}")
    if has_lora(model):
        raise UserInputError("the model already has LoRA adapters; build a fresh model to add new ones")
    unknown = set(projections) - set(ATTENTION_PROJECTIONS)
    if unknown:
        raise UserInputError(f"unknown projections {sorted(unknown)}; choose from {ATTENTION_PROJECTIONS}")
    if rank < 1:
        raise UserInputError(f"LoRA rank must be >= 1, got {rank}")
    config = LoraConfig(
        r=rank,
        # peft annotates lora_alpha as int; it only divides it by the rank, so a float alpha is fine
        lora_alpha=2 * rank if alpha is None else alpha,  # type: ignore[arg-type]
        lora_dropout=dropout,
        target_modules=lora_target_regex(projections, layers),
        bias="none",
    )
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    inject_adapter_in_model(config, model, adapter_name=ADAPTER_NAME)
    for name, parameter in model.named_parameters():
        parameter.requires_grad_(".lora_" in name)
    return config


def has_lora(model: HookedVLM) -> bool:
    return bool(lora_layers(model))


def lora_layers(model: HookedVLM) -> dict[str, Any]:
    """Our module name -> peft LoRA layer (e.g. "blocks.0.attn.q_proj")."""
    from peft.tuners.lora import LoraLayer

    return {name: module for name, module in model.named_modules() if isinstance(module, LoraLayer)}


def lora_parameters(model: HookedVLM) -> dict[str, nn.Parameter]:
    """Trainable LoRA parameters by name (stable order: the module tree's)."""
    return {name: p for name, p in model.named_parameters() if ".lora_" in name}


def lora_config(model: HookedVLM):
    """The `LoraConfig` peft stored on the model."""
    config = getattr(model, "peft_config", {}).get(ADAPTER_NAME)
    if config is None:
        raise UserInputError("the model has no LoRA adapters: call vlens.training.add_lora(model) first")
    return config

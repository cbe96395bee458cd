"""Growing a trained model's vision tower (a curriculum step between training stages).

New vision blocks are appended with their output projections (attention `proj`, MLP
`down_proj`) set to zero, so each new block starts as the identity on the residual stream
and the grown model computes exactly what the smaller one did; training then gives the
tower the depth it needs for harder visual features (shapes) without starting over.
"""

from __future__ import annotations

from typing import cast

import torch
from transformers import Qwen2_5_VLForConditionalGeneration
from transformers.models.qwen2_5_vl.configuration_qwen2_5_vl import (
    Qwen2_5_VLTextConfig,
    Qwen2_5_VLVisionConfig,
)

from vlens.utils.errors import UserInputError


def full_attention_blocks_after_growth(old_full: list[int], old_depth: int, new_depth: int) -> list[int]:
    """Keep the old full-attention blocks and make the new last block full attention too
    (Qwen2.5-VL alternates windowed blocks with a periodic full-attention block)."""
    return sorted(set(old_full) | {new_depth - 1}) if new_depth > old_depth else list(old_full)


def grow_vision_tower(
    model: Qwen2_5_VLForConditionalGeneration, depth: int, seed: int = 0
) -> Qwen2_5_VLForConditionalGeneration:
    """A copy of `model` whose vision tower has `depth` blocks (the first ones are the
    model's; the rest start as the identity). Raises ValueError if `depth` is not larger."""
    vision = cast(Qwen2_5_VLVisionConfig, model.config.vision_config)
    if depth <= vision.depth:
        raise UserInputError(f"grow the vision tower to more than its {vision.depth} blocks, got depth {depth}")
    config = model.config.__class__.from_dict(model.config.to_dict())
    grown_vision = cast(Qwen2_5_VLVisionConfig, config.vision_config)
    grown_vision.fullatt_block_indexes = full_attention_blocks_after_growth(
        list(vision.fullatt_block_indexes), vision.depth, depth
    )
    grown_vision.depth = depth
    torch.manual_seed(seed)
    # HF wraps Module.to with functools.wraps: mypy reads the unbound signature (self first)
    grown = Qwen2_5_VLForConditionalGeneration(config).to(next(model.parameters()).dtype)  # type: ignore[arg-type]
    missing, unexpected = grown.load_state_dict(model.state_dict(), strict=False)
    new_blocks = range(vision.depth, depth)
    expected_missing = {name for name, _ in grown.named_parameters() if _in_blocks(name, new_blocks)}
    if unexpected or set(missing) - expected_missing:
        raise RuntimeError(
            f"growing the vision tower lost weights: missing {missing}, unexpected {unexpected}"
        )
    with torch.no_grad():
        for index in new_blocks:
            block = grown.model.visual.blocks[index]
            for layer in (block.attn.proj, block.mlp.down_proj):
                layer.weight.zero_()
                layer.bias.zero_()
    grown.generation_config = model.generation_config
    return grown.eval() if not model.training else grown


def _in_blocks(name: str, blocks: range) -> bool:
    return any(f"visual.blocks.{index}." in name for index in blocks)


def grown_layer_positions(old_layers: int, new_layers: int) -> list[int]:
    """Where the old decoder layers sit in the grown stack: spread evenly, so the new
    identity layers interleave with them (4 -> 8: 0, 2, 4, 6)."""
    if new_layers <= old_layers:
        raise UserInputError(f"grow the decoder to more than its {old_layers} layers, got {new_layers}")
    return [index * new_layers // old_layers for index in range(old_layers)]


def grow_decoder(
    model: Qwen2_5_VLForConditionalGeneration, layers: int, seed: int = 0
) -> Qwen2_5_VLForConditionalGeneration:
    """A copy of `model` whose language model has `layers` decoder layers: the model's own
    at `grown_layer_positions`, new ones between them with zero output projections
    (attention `o_proj`, MLP `down_proj`), so the grown model computes what the smaller one
    did. Raises ValueError if `layers` is not larger."""
    text = cast(Qwen2_5_VLTextConfig, model.config.text_config)
    positions = grown_layer_positions(text.num_hidden_layers, layers)
    config = model.config.__class__.from_dict(model.config.to_dict())
    grown_text = cast(Qwen2_5_VLTextConfig, config.text_config)
    grown_text.num_hidden_layers = layers
    if text.layer_types is not None:  # every layer attends fully (no sliding window)
        grown_text.layer_types = [text.layer_types[0]] * layers
    torch.manual_seed(seed)
    grown = Qwen2_5_VLForConditionalGeneration(config).to(next(model.parameters()).dtype)  # type: ignore[arg-type]
    prefix = "model.language_model.layers."
    renamed = {}
    for name, tensor in model.state_dict().items():
        if name.startswith(prefix):
            old, rest = name[len(prefix) :].split(".", 1)
            name = f"{prefix}{positions[int(old)]}.{rest}"
        renamed[name] = tensor
    missing, unexpected = grown.load_state_dict(renamed, strict=False)
    new_layers = sorted(set(range(layers)) - set(positions))
    expected = {n for n, _ in grown.named_parameters() if any(n.startswith(f"{prefix}{i}.") for i in new_layers)}
    if unexpected or set(missing) - expected:
        raise RuntimeError(f"growing the decoder lost weights: missing {missing}, unexpected {unexpected}")
    with torch.no_grad():
        for index in new_layers:
            layer = grown.model.language_model.layers[index]
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
    grown.generation_config = model.generation_config
    return grown.eval() if not model.training else grown

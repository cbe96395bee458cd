"""The embedded model's architecture: a tiny `Qwen2_5_VLForConditionalGeneration`.

The real HF class with small numbers: a 4-block vision tower of width 96 (blocks 0 and 2
windowed, as Qwen2.5-VL does, blocks 1 and 3 full attention) feeding a 4-layer decoder with
8 query heads over 2 key/value heads (grouped-query attention) and M-RoPE. This is the
from-scratch build; a later recipe stage may grow the vision tower
(vlens.recipes.embedded.growth), so the shipped model's config, not these constants, is the
reference for its shape.
"""

from __future__ import annotations

import torch
from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

from vlens.utils.errors import UserInputError
from vlens.zoo.processor import MERGE_SIZE, PATCH_SIZE, TEMPORAL_PATCH_SIZE

TEXT_LAYERS = 4
TEXT_WIDTH = 128
TEXT_HEADS = 8
TEXT_KV_HEADS = 2
TEXT_MLP = 384
VISION_DEPTH = 4
VISION_WIDTH = 96
VISION_HEADS = 4
VISION_MLP = 256
VISION_FULL_ATTENTION_BLOCKS = [1, 3]  # the others attend within 8 x 8-patch windows
# M-RoPE splits the d_head / 2 = 8 rotary frequencies into (time, height, width) sections,
# highest frequencies first: the width axis gets the lowest ones.
MROPE_SECTION = [2, 3, 3]
ROPE_THETA = 10000.0


def build_config(
    tokenizer,
    rope_theta: float = ROPE_THETA,
    mrope_section: list[int] | None = None,
    text_layers: int | None = None,
) -> Qwen2_5_VLConfig:
    """The tiny Qwen2.5-VL config; vocabulary and special-token ids come from `tokenizer`.

    rope_theta / mrope_section: the decoder's M-RoPE (`axis_rotations` says how far each image
    axis rotates across the grid; at theta 1e4 the width axis barely moves); text_layers: the
    decoder's depth (default TEXT_LAYERS)."""
    section = list(mrope_section or MROPE_SECTION)
    if sum(section) != TEXT_WIDTH // TEXT_HEADS // 2 or min(section) < 1:
        raise UserInputError(
            f"mrope_section {section} must be 3 positive numbers summing to d_head / 2 = "
            f"{TEXT_WIDTH // TEXT_HEADS // 2}"
        )
    ids = tokenizer.convert_tokens_to_ids
    text_config = {
        "vocab_size": len(tokenizer),
        "hidden_size": TEXT_WIDTH,
        "intermediate_size": TEXT_MLP,
        "num_hidden_layers": text_layers or TEXT_LAYERS,
        "num_attention_heads": TEXT_HEADS,
        "num_key_value_heads": TEXT_KV_HEADS,
        "max_position_embeddings": 1024,
        "rms_norm_eps": 1e-6,
        "rope_parameters": {"rope_type": "default", "rope_theta": float(rope_theta), "mrope_section": section},
        "bos_token_id": ids("<|endoftext|>"),
        "eos_token_id": ids("<|im_end|>"),
        "pad_token_id": ids("<|endoftext|>"),
        "tie_word_embeddings": False,
    }
    vision_config = {
        "depth": VISION_DEPTH,
        "hidden_size": VISION_WIDTH,
        "intermediate_size": VISION_MLP,
        "num_heads": VISION_HEADS,
        "out_hidden_size": TEXT_WIDTH,
        "patch_size": PATCH_SIZE,
        "spatial_merge_size": MERGE_SIZE,
        "temporal_patch_size": TEMPORAL_PATCH_SIZE,
        "window_size": 112,  # 8 x 8 patches, as in Qwen2.5-VL
        "fullatt_block_indexes": VISION_FULL_ATTENTION_BLOCKS,
    }
    return Qwen2_5_VLConfig(
        text_config=text_config,
        vision_config=vision_config,
        image_token_id=ids("<|image_pad|>"),
        video_token_id=ids("<|video_pad|>"),
        vision_start_token_id=ids("<|vision_start|>"),
        vision_end_token_id=ids("<|vision_end|>"),
        tie_word_embeddings=False,
    )


def axis_rotations(rope_theta: float, mrope_section: list[int], d_head: int, grid: int) -> dict[str, float]:
    """The largest relative rotation (radians) M-RoPE gives two image tokens at opposite ends
    of a `grid`-token row ("width") or column ("height"): max over the axis's frequencies of
    (grid - 1) * theta^(-2i / d_head). A decoder can only tell positions apart along an axis
    whose rotation is measurable."""
    inverse = [rope_theta ** (-2 * i / d_head) for i in range(d_head // 2)]
    t, h, _ = mrope_section
    return {
        "height": (grid - 1) * max(inverse[t : t + h]),
        "width": (grid - 1) * max(inverse[t + h :]),
    }


def build_model(config: Qwen2_5_VLConfig, seed: int) -> Qwen2_5_VLForConditionalGeneration:
    """A freshly initialised fp32 model, deterministic in `seed`."""
    torch.manual_seed(seed)
    model = Qwen2_5_VLForConditionalGeneration(config)
    return model.float()


def parameter_count(model: torch.nn.Module) -> int:
    """Number of trainable parameters."""
    return sum(parameter.numel() for parameter in model.parameters())

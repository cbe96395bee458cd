"""Every family's hooks, by the HF config: per-head `hook_z` / `hook_pattern` on every decoder layer (per-head
`hook_z` on a linear-attention layer), and `hook_resid_post` / per-head `attn.hook_z` on every vision block
the HF tower has, with the tower's width and heads (Qwen2-VL's and Qwen2.5-VL's towers are hooked per block,
not per head: the README's table says so)."""

from __future__ import annotations

import pytest
import torch

from tests.helpers.models import FAMILIES, QWEN_FAMILIES, tiny_pair
from vlens.testing import random_image


def _vision_shape(vision_config) -> tuple[int, int, int]:
    """(blocks, width, heads) of the HF tower, whichever names its config uses."""
    blocks = getattr(vision_config, "num_hidden_layers", None) or vision_config.depth
    # Qwen2-VL's hidden_size is the merger's output: its blocks are embed_dim wide
    width = getattr(vision_config, "embed_dim", None) or vision_config.hidden_size
    heads = getattr(vision_config, "num_attention_heads", None) or vision_config.num_heads
    return blocks, width, heads


@pytest.mark.parametrize("family", FAMILIES)
def test_every_decoder_layer_and_vision_block_is_hooked_per_head(family):
    hf, model = tiny_pair(family)
    inputs = model.prepare(images=[random_image(60, 44, 1), random_image(40, 64, 2)],
                           prompts=["How many dots are there?", "red"])
    with torch.no_grad():
        _, cache = model.run_with_cache(inputs)
    b, p = inputs.input_ids.shape
    text = hf.config.get_text_config()
    assert model.cfg.n_layers == text.num_hidden_layers
    for layer in range(text.num_hidden_layers):
        heads, d_head = model.cfg.heads_at(layer), model.cfg.d_head_at(layer)
        assert cache[f"blocks.{layer}.attn.hook_z"].shape == (b, p, heads, d_head), (family, layer)
        if not model.cfg.is_linear_attention(layer):
            assert heads == text.num_attention_heads
            assert cache[f"blocks.{layer}.attn.hook_pattern"].shape == (b, heads, p, p), (family, layer)
    blocks, width, vision_heads = _vision_shape(hf.config.vision_config)
    hooked = {int(name.split(".")[2]) for name in cache.cache_dict if name.startswith("vision.blocks.")}
    assert hooked == set(range(blocks)), family
    for block in range(blocks):
        resid = cache[f"vision.blocks.{block}.hook_resid_post"]
        assert resid.shape[-1] == width, (family, block)
        if family not in QWEN_FAMILIES:
            z = cache[f"vision.blocks.{block}.attn.hook_z"]
            assert z.shape == (*resid.shape[:-1], vision_heads, width // vision_heads), (family, block)

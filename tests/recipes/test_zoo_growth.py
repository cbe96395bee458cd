"""Growing the embedded model's vision tower keeps what the model computes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from vlens.recipes.embedded.batches import collate, encode_example, to_model_image
from vlens.recipes.embedded.growth import (
    full_attention_blocks_after_growth,
    grow_decoder,
    grow_vision_tower,
    grown_layer_positions,
)
from vlens.recipes.embedded.recipe import build_untrained
from vlens.recipes.embedded.training_set import source_makers


def _batch(processor, n: int = 3) -> dict:
    makers = source_makers(vary=False)
    samples = [makers["colour"](seed) for seed in range(n)]
    images = torch.from_numpy(np.stack([to_model_image(image) for image, _ in samples]))
    examples = [encode_example(processor, r["question"], r["answer"], i) for i, (_, r) in enumerate(samples)]
    return collate(examples, images, processor.tokenizer.pad_token_id, processor.image_token_id)


def test_grown_tower_starts_as_the_identity_and_then_trains():
    _, processor, model = build_untrained(seed=1)
    with torch.no_grad():  # a non-trivial model: perturb the weights away from init
        for parameter in model.parameters():
            parameter.add_(0.02 * torch.randn_like(parameter))
    model.eval()
    grown = grow_vision_tower(model, depth=6)
    assert grown.config.vision_config.depth == 6 and len(grown.model.visual.blocks) == 6
    assert grown.config.vision_config.fullatt_block_indexes == [1, 3, 5]
    batch = _batch(processor)
    with torch.no_grad():
        torch.testing.assert_close(grown(**batch).logits, model(**batch).logits, rtol=0, atol=1e-6)
    grown.train()
    grown(**batch).loss.backward()
    new_block = grown.model.visual.blocks[5]
    assert new_block.attn.proj.weight.grad.abs().sum() > 0  # the zero projections receive gradient
    assert new_block.mlp.down_proj.weight.grad.abs().sum() > 0


def test_growth_needs_a_larger_depth_and_keeps_full_attention_blocks():
    _, _, model = build_untrained(seed=1)
    with pytest.raises(ValueError, match="more than its 4 blocks"):
        grow_vision_tower(model, depth=4)
    assert full_attention_blocks_after_growth([1], 2, 5) == [1, 4]


def test_grown_decoder_starts_as_the_identity_and_then_trains():
    _, processor, model = build_untrained(seed=2)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.02 * torch.randn_like(parameter))
    model.eval()
    grown = grow_decoder(model, layers=8)
    assert grown.config.text_config.num_hidden_layers == 8 and len(grown.model.language_model.layers) == 8
    old, new = model.model.language_model.layers, grown.model.language_model.layers
    for index, position in enumerate((0, 2, 4, 6)):  # the old layers, spread out
        torch.testing.assert_close(new[position].self_attn.q_proj.weight, old[index].self_attn.q_proj.weight)
    batch = _batch(processor)
    with torch.no_grad():
        torch.testing.assert_close(grown(**batch).logits, model(**batch).logits, rtol=0, atol=1e-5)
    grown.train()
    grown(**batch).loss.backward()
    assert new[3].self_attn.o_proj.weight.grad.abs().sum() > 0  # the zero projections receive gradient
    assert new[3].mlp.down_proj.weight.grad.abs().sum() > 0


def test_decoder_growth_needs_more_layers():
    _, _, model = build_untrained(seed=1)
    with pytest.raises(ValueError, match="more than its 4 layers"):
        grow_decoder(model, layers=4)
    assert grown_layer_positions(4, 8) == [0, 2, 4, 6]
    assert grown_layer_positions(4, 6) == [0, 1, 3, 4]


def test_growing_needs_a_folder_to_grow():
    from vlens.recipes.embedded.recipe import check_settings
    from vlens.recipes.embedded.settings import RecipeSettings
    from vlens.utils.errors import UserInputError

    with pytest.raises(UserInputError, match="--grow-text-layers: growing the decoder needs"):
        check_settings(RecipeSettings(grow_text_layers=8))

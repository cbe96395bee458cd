"""The real-vocabulary fixture: exact widths of the real checkpoints, LLaVA / Qwen3-VL variants."""

from __future__ import annotations

import pytest
import torch

from vlens.core.answers import answer_ids, contrast
from vlens.testing import random_image
from vlens.testing.real_vocab import REAL_SHAPES, real_shape_config, real_vocab_model

WIDTHS = {  # (d_model, n_heads, n_kv_heads, d_mlp, vocab, vision width) of the real config.json files
    "qwen2.5-vl-7b": (3584, 28, 4, 18944, 152064, 1280),
    "qwen2.5-vl-3b": (2048, 16, 2, 11008, 151936, 1280),
    "qwen3-vl-8b": (4096, 32, 8, 12288, 151936, 1152),
    "llava-1.5-7b": (4096, 32, 32, 11008, 32064, 1024),
}


@pytest.mark.parametrize("name", sorted(REAL_SHAPES))
def test_real_shape_configs_have_the_exact_widths(name):
    config = real_shape_config(name, n_layers=2, vision_depth=2)
    text, vision = config.text_config, config.vision_config
    got = (text.hidden_size, text.num_attention_heads, text.num_key_value_heads, text.intermediate_size,
           text.vocab_size, vision.hidden_size)
    assert got == WIDTHS[name]
    assert text.num_hidden_layers == 2


@pytest.mark.parametrize("name", ["qwen3-vl-8b", "llava-1.5-7b"])
def test_other_families_run_with_the_real_vocabulary(name):
    model = real_vocab_model(name, tiny=True, n_layers=1, vision_depth=1, min_pixels=64 * 64, max_pixels=64 * 64)
    inputs = model.prepare(images=[random_image(64, 64)], prompts=["How many dots are there?"])
    with torch.no_grad():
        logits = model(inputs)
    assert logits.shape[-1] == WIDTHS[name][4]
    assert answer_ids(model, "12")[-2:] == [answer_ids(model, "1")[-1], answer_ids(model, "2")[-1]]
    end = model.tokenizer.eos_token_id
    assert contrast(model, "1", "12").clean_id == end
    if name == "llava-1.5-7b":
        assert model.tokenizer.convert_tokens_to_ids(["<unk>", "<s>", "</s>", "<image>", "<pad>"]) == [0, 1, 2,
                                                                                                      32000, 32001]

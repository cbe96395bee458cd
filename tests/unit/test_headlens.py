"""HeadLens: a planted "3" head decodes to "3" with a high CTER; head logits add up to the lens
logits of the layer; image attention equals the pattern's mass; lenses for other models are refused."""

from __future__ import annotations

import pytest
import torch

from tests.helpers.headlens_models import (
    PLANTED_HEAD,
    PLANTED_LAYER,
    planted_three_model,
    tiny_model,
    two_image_batch,
)
from vlens import SweepOptions
from vlens.lens.corpus import task_samples
from vlens.lens.decomposition import head_contributions
from vlens.lens.head_scores import compute_head_scores
from vlens.lens.headlens import HeadLens
from vlens.lens.readout import LensReadout
from vlens.lens.translators import LensMismatchError, Translators

torch.set_num_threads(1)
QWEN = "Qwen2_5_VLForConditionalGeneration"


def _batch(model, n: int = 4):
    samples = task_samples(n, size=56)
    return model.prepare(images=[s[0] for s in samples], prompts=[s[1] for s in samples])


def test_planted_head_decodes_three():
    model = planted_three_model()
    out = HeadLens(model).run(_batch(model), k=10)
    three = model.tokenizer.convert_tokens_to_ids("3")
    numbers = {model.tokenizer.convert_tokens_to_ids(str(i)) for i in range(11)}
    top = out.top_ids[:, 0, PLANTED_LAYER, PLANTED_HEAD]  # [batch, k]
    assert (top[:, 0] == three).all()
    assert all(set(row.tolist()) <= numbers for row in top)
    assert out.top_tokens(model.tokenizer, 0, PLANTED_LAYER, PLANTED_HEAD)[0] == "3"
    assert (out.model_top1[:, 0] == three).all()  # the head dominates the answer too


def test_planted_head_scores_high_cter_and_answer_alignment():
    model = planted_three_model()
    scores = compute_head_scores(model, task_samples(12, size=56), k=10,
                                 options=SweepOptions(batch_size=6, progress=False))
    assert scores.n_examples == 12 and scores.cter.shape == (2, 4)
    assert scores.cter[PLANTED_LAYER, PLANTED_HEAD] == 1.0
    assert scores.cter[PLANTED_LAYER, PLANTED_HEAD] == scores.cter.max()
    assert scores.answer_alignment[PLANTED_LAYER, PLANTED_HEAD] == 1.0
    assert scores.top_tokens[(PLANTED_LAYER, PLANTED_HEAD)][0] == ("3", 12)
    head = scores.to_dict()["heads"][PLANTED_LAYER * 4 + PLANTED_HEAD]
    assert head["scores"]["cter"] == 1.0 and head["top_tokens"][0] == ["3", 12]


def _z_and_resid(model, layer: int):
    """hook_z and hook_resid_post of one layer on the two-image batch."""
    inputs = two_image_batch(model)
    _, cache = model.run_with_cache(inputs, names_filter=lambda n: n.endswith(("hook_z", "hook_resid_post")))
    return cache[f"blocks.{layer}.attn.hook_z"], cache[f"blocks.{layer}.hook_resid_post"]


def _random_translators(model, a_std: float, b_std: float) -> Translators:
    translators = Translators.for_model(model)
    with torch.no_grad():
        translators.A.normal_(0, a_std)
        translators.b.normal_(0, b_std)
    return translators


def test_head_logits_add_up_to_the_translated_residual():
    """sum_i l_i + readout(T^lin(rest) + b) at the residual's own scale == lens logits of the layer."""
    model = tiny_model(QWEN)
    translators = _random_translators(model, 0.2, 0.2)
    lens = HeadLens(model, translators)
    layer = 0
    z, resid = _z_and_resid(model, layer)
    per_head = lens.decode_heads(z, resid, layer)  # [batch, pos, H, V]
    readout = LensReadout.from_model(model)
    translated = translators(resid, layer)
    scale = readout.scale(translated)
    rest = resid - head_contributions(z, model.blocks[layer].attn.W_O).sum(-2)
    rest_logits = readout.logits(translators(rest, layer), scale=scale)
    torch.testing.assert_close(per_head.sum(-2) + rest_logits, readout.logits(translated), atol=1e-4, rtol=1e-4)


def test_include_bias_adds_the_translator_bias_to_each_head():
    model = tiny_model(QWEN)
    translators = _random_translators(model, 0.0, 1.0)
    z, resid = _z_and_resid(model, 1)
    plain = HeadLens(model, translators).decode_heads(z, resid, 1)
    biased = HeadLens(model, translators, include_bias=True).decode_heads(z, resid, 1)
    readout = LensReadout.from_model(model)
    scale = readout.scale(translators(resid, 1)).unsqueeze(-2)
    expected = readout.logits(translators.b[1].expand_as(resid).unsqueeze(-2), scale=scale, add_bias=False)
    torch.testing.assert_close(biased - plain, expected.expand_as(plain), atol=1e-4, rtol=1e-4)


def test_image_attention_and_positions_match_the_cache():
    model = tiny_model(QWEN)
    inputs = two_image_batch(model)
    positions = torch.stack([inputs.regions.final, inputs.regions.final - 1], 1)
    out = HeadLens(model).run(inputs, positions=positions, k=3, layers=[1])
    assert out.top_ids.shape == (2, 2, 1, model.cfg.n_heads, 3)
    _, cache = model.run_with_cache(inputs, names_filter=lambda n: n.endswith("hook_pattern"))
    pattern = cache["blocks.1.attn.hook_pattern"]  # [batch, H, q, k]
    image = inputs.input_ids == model.cfg.image_token_id
    for row in range(2):
        for j in range(2):
            expected = pattern[row, :, positions[row, j]][:, image[row]].sum(-1)
            torch.testing.assert_close(out.image_attention[row, j, 0], expected, atol=1e-5, rtol=0)
    n_image = image.sum(-1).float()
    final_share = n_image / (inputs.attention_mask.sum(-1).float())
    torch.testing.assert_close(out.image_share[:, 0], final_share)


def test_lens_for_another_model_is_refused():
    model = tiny_model(QWEN)
    with pytest.raises(LensMismatchError):
        HeadLens(planted_three_model(), Translators.for_model(model))


def test_bad_arguments_are_explained():
    model = tiny_model(QWEN)
    inputs = two_image_batch(model)
    with pytest.raises(ValueError, match="'final' or a LongTensor"):
        HeadLens(model).run(inputs, positions="middle")
    with pytest.raises(IndexError, match="layers must lie"):
        HeadLens(model).run(inputs, layers=[5])

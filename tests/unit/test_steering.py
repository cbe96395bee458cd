"""Steering: a planted direction flips a tiny model's greedy token; strength 0 is the plain generation;
the directions are the hand-computed vectors; the result loads back."""

from __future__ import annotations

import pytest
import torch

from tests.helpers.models import tiny_vlm
from tests.helpers.results import without_provenance
from vlens import load_result
from vlens.sae import StandardSAEConfig, build_sae
from vlens.steering import (
    SteeringResult,
    SteeringSettings,
    mean_difference,
    probe_direction,
    sae_direction,
    steer,
    steering_hooks,
    transcoder_direction,
)
from vlens.testing import random_image
from vlens.utils.errors import UserInputError


def planted(model):
    """(inputs, target token, direction): added at the last block's output, a large multiple of the
    direction makes the final norm's output point along W_U[target] (norm weight divided out), and the
    target has the longest unembedding row, so W_U[j] . W_U[target] < |W_U[target]|^2 for every other j:
    the greedy token becomes the target."""
    inputs = model.prepare(images=[random_image(56, 56, 3), None], prompts=["How many dots are there?", "red"])
    W_U = model.unembed.lm_head.weight.detach().float()  # [d_vocab, d_model]
    target = int(W_U.norm(dim=-1).argmax())
    scale = model.unembed.apply_norm_weight(torch.ones(model.cfg.d_model)).float()  # the final norm's weight
    return inputs, target, W_U[target] / scale


def test_a_planted_direction_flips_the_greedy_token_and_strength_0_is_plain():
    model = tiny_vlm("qwen2_vl")
    inputs, target, direction = planted(model)
    last = model.cfg.n_layers - 1
    settings = SteeringSettings(layers=(last,), strengths=(0.0, 1e4), prompt_region="final", max_new_tokens=3)
    result = steer(model, inputs, direction, settings, source="planted", progress=False)
    plain = model.generate(inputs, max_new_tokens=3)
    assert result.tokens[0] == plain.tokens.tolist() == result.plain_tokens  # strength 0: the plain generation
    assert (plain.tokens != target).all()
    assert all(row == [target] * 3 for row in result.tokens[1])  # the prompt's final position, then every step


def test_steering_from_a_step_leaves_the_earlier_tokens():
    model = tiny_vlm("qwen2_vl")
    inputs, target, direction = planted(model)
    settings = SteeringSettings(layers=(model.cfg.n_layers - 1,), strengths=(1e4,), prompt_region=None, from_step=1,
                                max_new_tokens=4)
    steered = torch.tensor(steer(model, inputs, direction, settings, progress=False).tokens[0])
    plain = model.generate(inputs, max_new_tokens=4).tokens
    # step 1 reads new token 1 and predicts token 2: tokens 0 and 1 are the plain ones
    assert torch.equal(steered[:, :2], plain[:, :2])
    assert (steered[:, 2:] == target).all()


def test_prompt_region_adds_only_there():
    model = tiny_vlm("llava")
    inputs = model.prepare(images=[random_image(40, 40, 1)], prompts=["red"])
    direction = torch.randn(model.cfg.d_model)
    settings = SteeringSettings(layers=(0,), prompt_region="image")
    name = settings.hook_names()[0]
    _, plain = model.run_with_cache(inputs, names_filter=[name])
    with model.hooks(fwd_hooks=steering_hooks(model, inputs, direction, 3.0, settings)):
        _, steered = model.run_with_cache(inputs, names_filter=[name])
    delta = steered[name] - plain[name]
    image = inputs.regions.image[0]
    torch.testing.assert_close(delta[0, image], (3.0 * direction).expand(len(image), -1))
    others = torch.ones(inputs.seq_len, dtype=torch.bool)
    others[image] = False
    assert delta[0, others].abs().max() == 0


def test_directions_are_the_hand_computed_vectors():
    model = tiny_vlm("qwen2_vl")
    hook = "blocks.0.hook_resid_post"
    pos = model.prepare(images=[random_image(56, 56, 1), random_image(56, 56, 2)], prompts=["red", "yes no"])
    neg = model.prepare(prompts=["How many dots are there?"])
    _, a = model.run_with_cache(pos, names_filter=[hook])
    _, b = model.run_with_cache(neg, names_filter=[hook])
    final_a = a[hook][torch.arange(2), pos.regions.final].mean(0)
    final_b = b[hook][0, neg.regions.final[0]]
    torch.testing.assert_close(mean_difference(model, pos, neg, hook), final_a - final_b)
    sae = build_sae(StandardSAEConfig(d_in=model.cfg.d_model, d_sae=8))
    sae.W_dec.data.normal_()
    torch.testing.assert_close(sae_direction(sae, 5), sae.W_dec[5].detach())
    w = torch.tensor([[1.0, 0.0, 2.0], [1.0, 4.0, 5.0]])
    torch.testing.assert_close(probe_direction(w), torch.tensor([0.0, 0.8, 0.6]))
    with pytest.raises(UserInputError, match="label"):
        probe_direction(torch.ones(3, 4))
    with pytest.raises(UserInputError, match="feature"):
        sae_direction(sae, 8)


def test_transcoder_direction_is_the_layers_decoder_row():
    from vlens.transcoders import TranscoderConfig, Transcoders

    tc = Transcoders(TranscoderConfig(kind="skip", activation="relu", d_model=6, d_tc=4, layers=(1, 3)))
    tc.initialize(torch.Generator().manual_seed(0))
    torch.testing.assert_close(transcoder_direction(tc, 3, 2), tc.W_dec[1][2, 0].detach())  # layer 3 is index 1
    for layer, feature, message in ((2, 0, "layers 1, 3"), (1, 4, r"\[0, 4\)")):
        with pytest.raises(UserInputError, match=message):
            transcoder_direction(tc, layer, feature)
    clt = Transcoders(TranscoderConfig(kind="clt", activation="relu", d_model=6, d_tc=4, layers=(0, 1)))
    with pytest.raises(UserInputError, match="cross-layer"):
        transcoder_direction(clt, 0, 0)


def test_result_loads_back_with_its_table(tmp_path):
    model = tiny_vlm("qwen2_vl")
    inputs, _, direction = planted(model)
    result = steer(model, inputs, direction, SteeringSettings(layers=(1,), strengths=(0.0, 5.0), max_new_tokens=2),
                   source="planted", progress=False)
    result.save(tmp_path)
    loaded = load_result(tmp_path)
    assert isinstance(loaded, SteeringResult) and without_provenance(loaded.to_dict()) == result.to_dict()
    assert "strength 5" in (tmp_path / "steering.html").read_text() and len(result.table()) == 2
    assert result.plot().data[0].type == "table"


def test_bad_settings_are_refused():
    model = tiny_vlm("qwen2_vl")
    inputs, _, direction = planted(model)
    for settings, match in [(SteeringSettings(layers=(9,)), "layers"), (SteeringSettings(hook="hook_nope"), "no hook"),
                            (SteeringSettings(prompt_region="middle"), "prompt_region"),
                            (SteeringSettings(prompt_region=None, generated=False), "nothing to steer"),
                            (SteeringSettings(strengths=(float("nan"),)), "finite")]:
        with pytest.raises(UserInputError, match=match):
            steer(model, inputs, direction, settings, progress=False)
    with pytest.raises(UserInputError, match="d_model"):
        steer(model, inputs, torch.ones(3), SteeringSettings(), progress=False)

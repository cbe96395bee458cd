"""Splicing SAEs into the forward, on known answers (tiny random Qwen2.5-VL)."""

from __future__ import annotations

import pytest
import torch

from tests.helpers.models import tiny_vlm
from vlens.sae import build_sae, make_config
from vlens.sae.activations import region_mask
from vlens.sae.attribution import ablate_features, feature_attribution
from vlens.testing import random_image
from vlens.utils.errors import UserInputError

HOOK = "blocks.0.hook_resid_post"


@pytest.fixture(scope="module")
def model():
    return tiny_vlm("qwen2_5_vl")


@pytest.fixture(scope="module")
def inputs(model):
    return model.prepare(images=[random_image(seed=1), random_image(seed=2)], prompts=["how many a", "b c"])


def random_sae(d_in: int, d_sae: int = 24, seed: int = 0, hook: str = HOOK):
    sae = build_sae(make_config("standard", d_in=d_in, d_sae=d_sae, hook_name=hook))
    sae.initialize(torch.Generator().manual_seed(seed), decoder_norm=1.0)
    with torch.no_grad():
        sae.b_dec.normal_(0, 0.5, generator=torch.Generator().manual_seed(seed + 1))
        sae.b_enc.fill_(0.05)
    return sae


def test_error_term_keeps_the_logits(model, inputs):
    sae = random_sae(model.cfg.d_model)
    clean = model(inputs)
    for positions in ("all", "image", "text", "final"):
        spliced = model.run_with_saes(inputs, saes={HOOK: sae}, positions=positions, use_error_term=True)
        assert torch.allclose(spliced, clean, atol=1e-4), positions
    assert not torch.allclose(model.run_with_saes(inputs, saes={HOOK: sae}), clean, atol=1e-2)


def test_reconstruction_replaces_only_the_chosen_positions(model, inputs):
    """An SAE with zero weights reconstructs b_dec: splicing it at the image positions is the hook that
    writes b_dec there."""
    sae = random_sae(model.cfg.d_model)
    with torch.no_grad():
        sae.W_enc.zero_()
        sae.W_dec.zero_()
    mask = inputs.regions.mask("image", inputs.seq_len)

    def write_b_dec(act, hook=None):
        return torch.where(mask.unsqueeze(-1), sae.b_dec.detach().to(act.dtype), act)

    expected = model.run_with_hooks(inputs, fwd_hooks=[(HOOK, write_b_dec)])
    spliced = model.run_with_saes(inputs, saes={HOOK: sae}, positions="image")
    assert torch.allclose(spliced, expected, atol=1e-5)
    masked = model.run_with_saes(inputs, saes={HOOK: sae}, positions=mask)
    assert torch.equal(masked, spliced)
    cells = region_mask(model, inputs, "image", cells=[(0, 1)])  # one cell of each image's grid
    assert cells.sum(-1).tolist() == [1, 1] and bool((cells <= mask).all())
    one_cell = model.run_with_hooks(inputs, fwd_hooks=[(HOOK, lambda a, hook=None: torch.where(
        cells.unsqueeze(-1), sae.b_dec.detach(), a))])
    assert torch.allclose(model.run_with_saes(inputs, saes={HOOK: sae}, positions=cells), one_cell, atol=1e-5)


def test_feature_activations_are_cached_and_hooks_removed(model, inputs):
    sae = random_sae(model.cfg.d_model)
    n_hooks = len(model.hook_dict)
    _, cache = model.run_with_cache(inputs, saes={HOOK: sae}, positions="text", use_error_term=True)
    acts = cache[f"{HOOK}.hook_sae_acts_post"]
    assert acts.shape == (*inputs.input_ids.shape, 24)
    text = inputs.regions.mask("text", inputs.seq_len)
    resid = cache[f"{HOOK}.hook_sae_input"]
    assert torch.allclose(acts[text], sae.encode(resid[text]))
    assert bool((acts[~text] == 0).all())
    assert len(model.hook_dict) == n_hooks and f"{HOOK}.hook_sae_acts_post" not in model.hook_dict
    assert all(not point.fwd_hooks for point in model.hook_dict.values())


def test_hooks_never_outlive_a_failing_call(model, inputs):
    sae = random_sae(model.cfg.d_model)

    def boom(act, hook=None):
        raise RuntimeError("boom")

    n_hooks = len(model.hook_dict)
    with pytest.raises(RuntimeError, match="boom"), model.saes({HOOK: sae}, positions="image", inputs=inputs):
        model.run_with_hooks(inputs, fwd_hooks=[(f"{HOOK}.hook_sae_acts_post", boom)])
    assert len(model.hook_dict) == n_hooks
    assert all(not point.fwd_hooks for point in model.hook_dict.values())
    with pytest.raises(UserInputError, match="needs the inputs"), model.saes({HOOK: sae}, positions="image"):
        pass
    with pytest.raises(UserInputError, match="not a hook|closest|Did you mean|hook"):
        model.run_with_saes(inputs, saes={"blocks.0.hook_resid_postt": sae})


def test_generate_with_error_term_equals_plain_generate(model, inputs):
    sae = random_sae(model.cfg.d_model)
    plain = model.generate(inputs, max_new_tokens=4)
    spliced = model.generate(inputs, max_new_tokens=4, saes={HOOK: sae}, positions="text", use_error_term=True)
    assert torch.equal(plain.tokens, spliced.tokens)
    seen = []
    with model.saes({HOOK: sae}, positions="text", inputs=inputs):
        model.generate(inputs, max_new_tokens=3,
                       fwd_hooks=[(f"{HOOK}.hook_sae_acts_post", lambda a, hook=None: seen.append(a.shape) or None)])
    assert seen[0][1] == inputs.seq_len and all(shape[1] == 1 for shape in seen[1:]) and len(seen) == 3


def test_hook_z_is_flattened(model, inputs):
    hook = "blocks.1.attn.hook_z"
    sae = random_sae(model.cfg.n_heads * model.cfg.d_head, hook=hook)
    clean = model(inputs)
    assert torch.allclose(model.run_with_saes(inputs, saes={hook: sae}, use_error_term=True), clean, atol=1e-4)


def test_attribution_equals_exact_ablation_where_the_metric_is_linear(model, inputs):
    """At ln_final.hook_normalized the logits are linear in the features, so gradient x activation is
    exactly minus the effect of ablating a feature."""
    hook = "ln_final.hook_normalized"
    sae = random_sae(model.cfg.d_model, d_sae=16, seed=3, hook=hook)
    token = 5

    def metric(logits):
        return logits[:, -1, token]

    attribution = feature_attribution(model, inputs, {hook: sae}, metric, positions="final")[hook]
    clean = metric(model(inputs))
    per_feature = attribution.sum(dim=1)  # [batch, d_sae]
    active = [f for f in range(16) if bool((per_feature[:, f] != 0).any())]
    assert active, "no feature fires at the final position"
    for feature in active[:4]:
        ablated = metric(ablate_features(model, inputs, {hook: sae}, {hook: [feature]}, positions="final"))
        assert torch.allclose(clean - ablated, per_feature[:, feature], atol=1e-4), feature


def test_feature_patching_is_exact_where_the_metric_is_linear(model, inputs):
    """At ln_final.hook_normalized, patching features from a corrupt run moves the logit by exactly
    grad . (acts_corrupt - acts_clean); patching from the run itself changes nothing."""
    from vlens.sae.attribution import patch_features

    hook = "ln_final.hook_normalized"
    sae = random_sae(model.cfg.d_model, d_sae=16, seed=5, hook=hook)
    corrupt = model.prepare(images=[random_image(seed=7), random_image(seed=8)], prompts=["how many a", "b c"])
    clean_logits = model(inputs)
    same = patch_features(model, inputs, inputs, {hook: sae})
    assert torch.allclose(same, clean_logits, atol=1e-4)
    token = 3
    patched = patch_features(model, inputs, corrupt, {hook: sae}, {hook: [0, 1, 2, 3]}, positions="final")
    _, clean_cache = model.run_with_cache(inputs, saes={hook: sae}, positions="final", use_error_term=True)
    _, corrupt_cache = model.run_with_cache(corrupt, saes={hook: sae}, positions="final", use_error_term=True)
    delta = (corrupt_cache[f"{hook}.hook_sae_acts_post"] - clean_cache[f"{hook}.hook_sae_acts_post"])[..., :4]
    # the readout is linear in the features: its gradient (taken through the splice) is the exact slope
    seen = {}

    def keep(acts, hook=None):
        acts.retain_grad()
        seen["acts"] = acts
        return acts

    with model.saes({hook: sae}, positions="final", use_error_term=True, inputs=inputs), torch.enable_grad():
        model.run_with_hooks(inputs, fwd_hooks=[(f"{hook}.hook_sae_acts_post", keep)])[:, -1, token].sum().backward()
    slope = seen["acts"].grad[:, -1, :4]
    expected = clean_logits[:, -1, token] + (delta[:, -1] * slope).sum(-1)
    assert torch.allclose(patched[:, -1, token], expected, atol=1e-4)

"""Adaptive head temperature: gamma from importance results, hooks on hook_attn_scores (context and
persistent), and the plain-HF export giving the same logits for every family."""

from __future__ import annotations

import functools
import math

import pytest
import torch

import vlens.testing as vt
from tests.helpers.models import build_pair
from vlens.interventions.temperature import (
    HeadTemperature,
    fit_temperature,
    importance_from_result,
    taxonomy_heads,
)


@functools.lru_cache(maxsize=4)
def _pair(family: str):
    return build_pair(family)


FAMILIES = ["qwen2_vl", "qwen2_5_vl", "qwen3_vl", "llava", "llava_next", "llava_onevision", "gemma3", "internvl",
            "idefics3", "smolvlm", "paligemma", "idefics2", "glm4v", "mistral3", "lfm2_vl", "aya_vision", "molmo2"]
# the families whose q projection can absorb a temperature (no query norm after it)
BAKED = ["qwen2_5_vl", "llava_next", "llava_onevision", "internvl", "idefics3", "smolvlm", "paligemma", "idefics2",
         "glm4v", "mistral3", "aya_vision"]


def _inputs(model):
    return model.prepare(
        images=[vt.random_image(64, 64, seed=1), vt.random_image(64, 96, seed=2)],
        prompts=["How many dots are there?", "red ?"],
    )


def test_fit_temperature_by_hand():
    importance = torch.tensor([[0.5, -1.0, 0.1], [2.0, 1.0, 0.0]])
    temp = fit_temperature(importance, top_k=3, alpha=1.2)  # heads L1H0, L1H1, L0H0 (positive only)
    assert temp.gammas == {(1, 0): 1.0, (1, 1): 0.5, (0, 0): 0.25}
    assert temp.betas == {(1, 0): pytest.approx(1.2), (1, 1): 1.0, (0, 0): 1.0}  # floor 1: never softened
    bare = fit_temperature(importance, top_k=2, alpha=1.2, floor=None, normalisation="mean")
    assert bare.betas == {(1, 0): pytest.approx(1.2 * 2 / 1.5), (1, 1): pytest.approx(1.2 * 1 / 1.5)}
    again = HeadTemperature.from_dict(temp.to_dict())
    assert again.betas == temp.betas and again.gammas == temp.gammas
    with pytest.raises(ValueError, match="no positive entry"):
        fit_temperature(-importance.abs())


def test_results_say_which_heads_the_multiplier_changes():
    importance = torch.tensor([[0.5, -1.0, 0.1], [2.0, 1.0, 0.0]])
    temp = fit_temperature(importance, top_k=3, alpha=1.2)  # L1H0 beta 1.2; L1H1 (0.6) and L0H0 (0.3) floored
    data = temp.to_dict()
    assert data["changed_heads"] == [[1, 0]] and data["unchanged_heads"] == [[0, 0], [1, 1]] and data["n_changed"] == 1
    by_head = {(e["layer"], e["head"]): e for e in data["heads"]}
    assert by_head[(1, 0)]["changed"] and by_head[(1, 0)]["logit_change"] == pytest.approx(0.2)
    assert by_head[(1, 1)]["floored"] and not by_head[(1, 1)]["changed"] and by_head[(1, 1)]["logit_change"] == 0
    summary = temp.summary()
    assert "L1H0: gamma 1.000 -> beta 1.200: attention logits x1.200 (+20.0%)" in summary
    assert "L1H1: gamma 0.500 -> beta 1.000: unchanged (alpha * gamma below the floor)" in summary
    assert summary.endswith("1 of 3 selected heads changed; left at beta = 1: L0H0, L1H1")


def test_heads_from_the_taxonomy_routing_and_aggregation():
    taxonomy = {"heads": [{"layer": 0, "head": 0, "class": "visual grounding", "stable": True},
                          {"layer": 1, "head": 0, "class": "cross-modal routing", "stable": False},
                          {"layer": 1, "head": 1, "class": "counting aggregation", "stable": True},
                          {"layer": 1, "head": 2, "class": "other"}]}
    assert taxonomy_heads(taxonomy) == [(1, 0), (1, 1)]
    assert taxonomy_heads(taxonomy, stable_only=True) == [(1, 1)]
    assert taxonomy_heads(taxonomy, classes=["visual grounding"]) == [(0, 0)]
    with pytest.raises(ValueError, match="unknown head classes"):
        taxonomy_heads(taxonomy, classes=["routing"])
    with pytest.raises(ValueError, match="not a HeadLens taxonomy"):
        taxonomy_heads({"results": {}})
    plain = fit_temperature(None, heads=taxonomy_heads(taxonomy), alpha=1.2)  # no importance: beta = alpha
    assert plain.betas == {(1, 0): 1.2, (1, 1): 1.2} and plain.changed() == [(1, 0), (1, 1)]
    importance = torch.tensor([[1.0, 0.0, 0.0], [-0.5, 2.0, 0.0]])  # L1H0 hurts when ablated: gamma < 0
    weighted = fit_temperature(importance, heads=taxonomy_heads(taxonomy), alpha=1.2)
    assert weighted.betas == {(1, 0): 1.0, (1, 1): pytest.approx(1.2)} and weighted.unchanged() == [(1, 0)]
    with pytest.raises(ValueError, match="no positive importance"):
        fit_temperature(importance, heads=taxonomy_heads(taxonomy), floor=None)


def test_temperature_fit_from_a_taxonomy_on_the_command_line(tmp_path, capsys):
    import json

    from vlens.cli import main

    folder = tmp_path / "headlens"
    folder.mkdir()
    (folder / "results.json").write_text(json.dumps({"heads": [
        {"layer": 0, "head": 1, "class": "cross-modal routing"}, {"layer": 1, "head": 0, "class": "other"}]}))
    assert main(["temperature", "fit", "--select", "taxonomy", "--taxonomy", str(folder), "--out",
                 str(tmp_path / "fit"), "--quiet"]) == 0
    data = json.loads((tmp_path / "fit" / "results.json").read_text())
    assert data["changed_heads"] == [[0, 1]] and data["source"]["selection"] == "taxonomy"
    assert "1 of 1 selected heads changed" in capsys.readouterr().out
    assert main(["temperature", "fit", "--select", "taxonomy", "--out", str(tmp_path / "f2"), "--quiet"]) == 2
    assert "needs --taxonomy" in capsys.readouterr().err


def test_importance_from_ablation_and_patching_json():
    ablation = {
        "task": "counting",
        "method": "mean",
        "alignment": "all",
        "n_examples": 4,
        "clean_logprob": -0.5,
        "clean_accuracy": 1.0,
        "ablated_logprob": [[-0.5, -2.5], [-1.0, -0.25]],
        "ablated_accuracy": [[1.0, 0.5], [0.75, 1.0]],
    }
    torch.testing.assert_close(
        importance_from_result(ablation), torch.tensor([[0.0, 2.0], [0.5, -0.25]], dtype=torch.float64)
    )
    report = {"results": {"counting": ablation, "colour": ablation}}
    torch.testing.assert_close(
        importance_from_result(report, task="counting", metric="accuracy"),
        torch.tensor([[0.0, 0.5], [0.25, 0.0]], dtype=torch.float64),
    )
    with pytest.raises(ValueError, match="pass task"):
        importance_from_result(report)
    patching = {
        "mode": "layer-head",
        "layers": [1, 3],
        "heads": ["H0", "H1"],
        "overwrite_rate": [[0.1, 0.4], [None, 0.2]],
    }
    torch.testing.assert_close(  # unpatched layers 0; a null (non-finite) cell stays NaN, never selected
        importance_from_result(patching, n_layers=4),
        torch.tensor([[0, 0], [0.1, 0.4], [0, 0], [float("nan"), 0.2]], dtype=torch.float64), equal_nan=True,
    )


def test_scores_are_scaled_by_beta_exactly():
    _, model = _pair("qwen2_5_vl")
    inputs = _inputs(model)
    temp = HeadTemperature({(0, 1): 1.5, (0, 3): 0.5})
    names = lambda n: n in ("blocks.0.attn.hook_attn_scores", "blocks.0.attn.hook_pattern")  # noqa: E731
    _, clean = model.run_with_cache(inputs, names_filter=names)
    with temp.applied(model):
        _, hot = model.run_with_cache(inputs, names_filter=names)
    scores = clean["blocks.0.attn.hook_attn_scores"]
    allowed = scores > torch.finfo(scores.dtype).min / 2
    beta = torch.tensor([1.0, 1.5, 1.0, 0.5])[None, :, None, None]
    expected = torch.softmax(torch.where(allowed, scores * beta, torch.finfo(scores.dtype).min), dim=-1)
    real = inputs.attention_mask.bool()[:, None, :, None].expand_as(
        expected
    )  # padding queries differ in no way
    torch.testing.assert_close(hot["blocks.0.attn.hook_pattern"][real], expected[real], atol=1e-6, rtol=1e-5)
    assert not model.blocks[0].attn.needs_pattern()


def test_persistent_mode_survives_reset_and_is_removable():
    _, model = _pair("qwen2_5_vl")
    inputs = _inputs(model)
    temp = HeadTemperature({(1, 0): 2.0, (0, 2): 1.3})
    with torch.no_grad():
        base = model(inputs)
        with temp.applied(model):
            scoped = model(inputs)
        handle = temp.attach(model)
        try:
            model.reset_hooks()  # what run_with_hooks & co. do; a permanent hook stays
            persistent = model(inputs)
        finally:
            handle.remove()
        after = model(inputs)
    assert (scoped - base).abs().max() > 1e-4
    torch.testing.assert_close(persistent, scoped)
    torch.testing.assert_close(after, base)
    assert not handle.active and not model.blocks[1].attn.needs_pattern()


@pytest.mark.parametrize("family", FAMILIES)
def test_hooked_and_hf_export_give_equal_logits(family):
    hf, model = _pair(family)
    inputs = _inputs(model)
    n_heads = model.cfg.n_heads
    temp = HeadTemperature({(0, 0): 1.2, (0, n_heads - 1): 1.7, (model.cfg.n_layers - 1, 1): 0.8})
    hf_kwargs = inputs.to_hf_kwargs()
    if family.startswith("llava"):  # HF's plain forward needs no mm_token_type_ids here
        hf_kwargs.pop("mm_token_type_ids", None)
    real = inputs.attention_mask.bool()
    with torch.no_grad():
        base = hf(**hf_kwargs).logits
        with temp.applied(model):
            hooked = model(inputs)
        # the export hooks HF modules that the HookedVLM shares: run the HF model while they are on
        with temp.export_to_hf(hf):
            exported = hf(**hf_kwargs).logits
        removed = hf(**hf_kwargs).logits
    assert (hooked[real] - base[real]).abs().max() > 1e-4
    torch.testing.assert_close(exported[real], hooked[real], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(removed, base)


def test_bad_heads_are_rejected():
    _, model = _pair("qwen2_5_vl")
    with pytest.raises(ValueError, match="outside the model's 2 layers"):
        HeadTemperature({(5, 0): 1.2}).hooks(model)
    with pytest.raises(ValueError, match="does not exist"):
        HeadTemperature({(0, 9): 1.2}).hooks(model)
    with pytest.raises(ValueError, match="positive"):
        HeadTemperature({(0, 0): -1.0})
    assert math.isclose(fit_temperature(torch.ones(2, 2), top_k=1).betas[(0, 0)], 1.2)


@pytest.mark.parametrize("family", BAKED)
def test_baked_checkpoint_equals_hooks(family, tmp_path):
    from transformers import AutoModelForImageTextToText

    hf, model = _pair(family)
    inputs = _inputs(model)
    temp = HeadTemperature({(0, 1): 1.4, (model.cfg.n_layers - 1, model.cfg.n_heads - 1): 0.7})
    hf.save_pretrained(str(tmp_path), state_dict=temp.baked_state_dict(hf))
    baked = AutoModelForImageTextToText.from_pretrained(str(tmp_path)).eval()
    real = inputs.attention_mask.bool()
    with torch.no_grad(), temp.applied(model):
        hooked = model(inputs)
    with torch.no_grad():
        hooked_base = model(inputs)
        kwargs = inputs.to_hf_kwargs()
        if family.startswith("llava"):
            kwargs.pop("mm_token_type_ids", None)
        theirs = baked(**kwargs).logits
    assert (hooked[real] - hooked_base[real]).abs().max() > 1e-4
    torch.testing.assert_close(theirs[real], hooked[real], atol=1e-4, rtol=1e-4)
    if family == "qwen2_5_vl":
        with pytest.raises(ValueError, match="query norm"):
            temp.baked_state_dict(_pair("qwen3_vl")[0])


def test_the_adapter_is_abstract_and_names_the_query_modules():
    """Temperature code reaches HF modules only through the adapter (`query_projection`, `query_norm`)."""
    from vlens.core.architectures import ArchitectureAdapter, adapter_for
    from vlens.testing import tiny_hf_model, tiny_llava_model, tiny_qwen3_vl_model

    with pytest.raises(TypeError, match="abstract"):
        ArchitectureAdapter()  # type: ignore[abstract]
    for hf, has_norm in ((tiny_hf_model("qwen2_5_vl"), False), (tiny_qwen3_vl_model(), True), (tiny_llava_model(), False)):
        adapter = adapter_for(hf)
        layers = adapter.decoder_layers(hf)
        assert len(layers) == adapter.build_config(hf).n_layers
        projection = adapter.query_projection(layers[0])
        assert projection.out_features == adapter.n_heads(hf) * adapter.build_config(hf).d_head
        assert (adapter.query_norm(layers[0]) is not None) == has_norm

"""Adapters of a HookedVLM exported to Hugging Face: peft folder round trip and merged checkpoint."""

from __future__ import annotations

import pytest
import torch

from tests.helpers.models import LORA_FAMILIES, build_pair, tiny_vlm
from vlens import HookedVLM
from vlens.testing import random_image
from vlens.training.export import load_adapters, save_adapters, save_merged
from vlens.training.lora import add_lora, lora_layers, lora_parameters


def _hf(family: str):
    """A fresh tiny HF model (same seed -> same weights as `_hooked`) and its processor."""
    hf, model = build_pair(family, seed=0)
    return hf, model.processor


def _hooked(family: str) -> HookedVLM:
    return tiny_vlm(family, fresh=True)  # the same weights as _hf(family) (seed 0)


def _hf_kwargs(inputs, family: str) -> dict:
    kwargs = inputs.to_hf_kwargs()
    if family.startswith("llava"):
        kwargs.pop("mm_token_type_ids", None)
    return kwargs


def _model_with_random_adapters(family: str) -> HookedVLM:
    model = _hooked(family)
    add_lora(model, rank=4)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():  # peft initialises B = 0 (a no-op adapter): make it do something
        for parameter in lora_parameters(model).values():
            parameter.copy_(0.2 * torch.randn(parameter.shape, generator=generator))
    return model


def _inputs(model):
    return model.prepare(
        images=[random_image(84, 64, seed=1), [random_image(64, 64, seed=2)] * 2],
        prompts=["How many dots are there?", "what colour is the shape ?"],
    )


@pytest.mark.parametrize("family", LORA_FAMILIES)
def test_lora_leaves_the_hf_model_clean(family):
    model = _model_with_random_adapters(family)
    # the softmax-attention layers (a hybrid decoder's linear-attention layers have no q/k/v/o projections)
    softmax = [x for x in range(model.cfg.n_layers) if not model.cfg.is_linear_attention(x)]
    hf_attn = model.adapter.language_model(model.hf_model).layers[softmax[0]].self_attn
    assert type(hf_attn.q_proj) is torch.nn.Linear
    assert model.blocks[softmax[0]].attn.q_proj.get_base_layer() is hf_attn.q_proj
    assert set(lora_layers(model)) == {
        f"blocks.{layer}.attn.{p}"
        for layer in softmax
        for p in ("q_proj", "k_proj", "v_proj", "o_proj")
    }
    assert all(not p.requires_grad for n, p in model.named_parameters() if ".lora_" not in n)
    assert not any("lora" in name for name, _ in model.vision.named_modules())


@pytest.mark.parametrize("family", LORA_FAMILIES)
def test_adapter_round_trip_through_peft(family, tmp_path):
    from peft import PeftModel

    model = _model_with_random_adapters(family)
    inputs = _inputs(model)
    with torch.no_grad():
        ours = model(inputs)
        base = _hooked(family)(inputs)
    assert (ours - base).abs().max() > 1e-3  # the adapters change the output

    save_adapters(model, tmp_path / "adapter")
    hf = PeftModel.from_pretrained(_hf(family)[0], str(tmp_path / "adapter")).eval()
    with torch.no_grad():
        hf_logits = hf(**_hf_kwargs(inputs, family)).logits
    mask = inputs.attention_mask.bool()
    torch.testing.assert_close(hf_logits[mask], ours[mask], atol=1e-4, rtol=1e-4)

    fresh = _hooked(family)
    load_adapters(fresh, tmp_path / "adapter")
    with torch.no_grad():
        torch.testing.assert_close(fresh(inputs), ours, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("family", LORA_FAMILIES)
def test_merged_checkpoint_matches_hooked_with_adapters(family, tmp_path):
    from transformers import AutoModelForImageTextToText

    model = _model_with_random_adapters(family)
    inputs = _inputs(model)
    before = {k: v.clone() for k, v in model.hf_model.state_dict().items()}
    save_merged(model, tmp_path / "merged")
    for key, value in model.hf_model.state_dict().items():  # the live model is untouched
        assert torch.equal(value, before[key])
    merged = AutoModelForImageTextToText.from_pretrained(str(tmp_path / "merged")).eval()
    with torch.no_grad():
        ours = model(inputs)
        theirs = merged(**_hf_kwargs(inputs, family)).logits
    mask = inputs.attention_mask.bool()
    torch.testing.assert_close(theirs[mask], ours[mask], atol=1e-4, rtol=1e-4)

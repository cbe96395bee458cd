"""Caches and models persist: `cache.save(path)` / `vlens.load_cache(path, model)` keep every entry and every
component of the residual decompositions (the image features included; a plain TransformerLens
ActivationCache rebuilt from the tensors loses them), shared storage included; `torch.save` of a model or a
cache is refused with what to do instead, and deepcopy still works."""

from __future__ import annotations

import copy
import io

import pytest
import torch
from safetensors.torch import save_file
from transformer_lens import ActivationCache

import vlens
from tests.helpers.models import tiny_vlm
from vlens.core.cache import VLMActivationCache
from vlens.testing import random_image
from vlens.utils.errors import UserInputError


@pytest.fixture(scope="module")
def run():
    model = tiny_vlm("qwen3_vl", fresh=True)  # DeepStack: image features enter after block 0 too
    inputs = model.prepare(images=[random_image(64, 64, 1), random_image(64, 48, 2)],
                           prompts=["How many dots are there?", "What colour?"])
    with torch.no_grad():
        logits, cache = model.run_with_cache(inputs)
    return model, inputs, logits, cache


def test_a_saved_cache_loads_back_with_every_entry_and_component(run, tmp_path):
    model, _, _, cache = run
    written = cache.save(tmp_path / "cache")
    assert written.name == "cache.safetensors"
    loaded = vlens.load_cache(written, model)
    assert isinstance(loaded, VLMActivationCache) and list(loaded.keys()) == list(cache.keys())
    assert loaded.has_batch_dim == cache.has_batch_dim
    for name in cache.keys():
        torch.testing.assert_close(loaded[name], cache[name], atol=0, rtol=0, msg=name)
    stack, labels = loaded.decompose_resid(return_labels=True)
    expected, expected_labels = cache.decompose_resid(return_labels=True)
    assert labels == expected_labels and "image_embed" in labels and "0_deepstack" in labels
    torch.testing.assert_close(stack, expected, atol=0, rtol=0)
    last = f"blocks.{model.cfg.n_layers - 1}.hook_resid_post"
    torch.testing.assert_close(stack.sum(0), cache[last], atol=1e-4, rtol=0)  # the parts add up
    # what a plain TransformerLens cache of the same tensors misses, silently
    plain = ActivationCache(dict(cache.cache_dict), model)
    _, plain_labels = plain.decompose_resid(return_labels=True)
    assert "image_embed" not in plain_labels


def test_views_of_one_tensor_and_a_batchless_cache_are_saved(run, tmp_path):
    model, _, _, _ = run
    one = model.prepare(images=[random_image(64, 64, 3)], prompts=["How many dots are there?"])
    with torch.no_grad():
        _, single = model.run_with_cache(one, remove_batch_dim=True,
                                         names_filter=lambda name: name.endswith("hook_resid_post"))
    assert not single.has_batch_dim
    resid = single["blocks.0.hook_resid_post"]
    single.cache_dict["first_half"] = resid[..., : resid.shape[-1] // 2]  # shares resid's storage
    loaded = vlens.load_cache(single.save(tmp_path / "views.safetensors"))
    assert loaded.has_batch_dim == single.has_batch_dim
    torch.testing.assert_close(loaded["first_half"], resid[..., : resid.shape[-1] // 2], atol=0, rtol=0)
    torch.testing.assert_close(loaded["blocks.0.hook_resid_post"], resid, atol=0, rtol=0)


def test_bad_cache_files_are_user_errors(run, tmp_path):
    model, _, _, cache = run
    other = tmp_path / "weights.safetensors"
    save_file({"w": torch.zeros(2)}, str(other))
    with pytest.raises(UserInputError, match="not a saved activation cache"):
        vlens.load_cache(other)
    (tmp_path / "junk.safetensors").write_bytes(b"\x00" * 40)
    with pytest.raises(UserInputError, match="not a readable safetensors"):
        vlens.load_cache(tmp_path / "junk.safetensors")
    with pytest.raises(UserInputError, match="does not exist"):
        vlens.load_cache(tmp_path / "missing.safetensors")
    written = cache.save(tmp_path / "c.safetensors")
    with pytest.raises(UserInputError, match="n_layers 3 there, 2 here"):
        vlens.load_cache(written, tiny_vlm("qwen2_5_vl"))


def test_torch_save_of_a_model_or_cache_says_what_to_do_instead(run):
    model, inputs, _, cache = run
    with pytest.raises(UserInputError, match=r"save_pretrained.*from_pretrained"):
        torch.save(model, io.BytesIO())
    with pytest.raises(UserInputError, match=r"cache\.save.*vlens\.load_cache"):
        torch.save(cache, io.BytesIO())
    twin = copy.deepcopy(model)
    with torch.no_grad():
        torch.testing.assert_close(twin(inputs), model(inputs), atol=0, rtol=0)
    assert copy.deepcopy(cache).model is model

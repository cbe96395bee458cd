"""One model across devices: `from_pretrained(device_map=..., max_memory=...)` against one device.

On a CPU-only machine the testable placements are a map whose every entry is "cpu" and maps
with disk offload (accelerate streams those blocks' weights on each call; explicit, or from
"auto" with a small `max_memory`). A CPU+GPU split runs where CUDA is available.
"""

from __future__ import annotations

import accelerate  # noqa: F401  (the dev extra installs it: device_map needs it)
import pytest
import torch

from vlens import HookedVLM
from vlens.patching import build_pair_batch, make_count_pairs, patch_layer_head
from vlens.testing import random_image, tiny_hf_model, tiny_qwen_processor

N_LAYERS = 4
PROMPTS = ["How many dots are there?", "What colour is the shape?"]


def module_names(gpu_layers: tuple[int, ...] = (), disk_layers: tuple[int, ...] = (), disk_head: bool = False,
                 gpu: int | str = 0) -> dict:
    """A device map over the tiny model's HF modules ("cpu" unless listed)."""
    lm = "model.language_model"
    placement = {"model.visual": "cpu", f"{lm}.embed_tokens": "cpu", f"{lm}.rotary_emb": "cpu",
                 f"{lm}.norm": "disk" if disk_head else "cpu", "lm_head": "disk" if disk_head else "cpu"}
    for layer in range(N_LAYERS):
        placement[f"{lm}.layers.{layer}"] = gpu if layer in gpu_layers else "disk" if layer in disk_layers else "cpu"
    return placement


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny-checkpoint")
    tiny_hf_model("qwen2_5_vl", n_layers=N_LAYERS, seed=3).save_pretrained(folder)
    tiny_qwen_processor().save_pretrained(str(folder))
    return str(folder)


@pytest.fixture(scope="module")
def reference(checkpoint):
    return HookedVLM.from_pretrained(checkpoint)


def _inputs(model):
    images = [random_image(56, 56, 1), random_image(84, 56, 2)]
    return model.prepare(images=images, prompts=PROMPTS)


def _assert_same_model(model, reference, atol=0.0):
    inputs, ref_inputs = _inputs(model), _inputs(reference)
    with torch.no_grad():
        torch.testing.assert_close(model(inputs).cpu(), reference(ref_inputs), atol=atol, rtol=0)
        # a hook edit, a cache kept on CPU, and greedy generation behave the same
        def edit(z, hook):
            z[:, :, 1] = 0.0
            return z

        name = "blocks.2.attn.hook_z"
        torch.testing.assert_close(model.run_with_hooks(inputs, fwd_hooks=[(name, edit)]).cpu(),
                                   reference.run_with_hooks(ref_inputs, fwd_hooks=[(name, edit)]), atol=atol, rtol=0)
        _, cache = model.run_with_cache(inputs, device="cpu")
        _, ref_cache = reference.run_with_cache(ref_inputs)
        for key in ("blocks.0.hook_resid_post", "blocks.3.attn.hook_pattern", "ln_final.hook_normalized"):
            assert cache[key].device.type == "cpu"
            torch.testing.assert_close(cache[key], ref_cache[key], atol=atol, rtol=0)
    assert model.generate(inputs, max_new_tokens=4).tokens.tolist() == \
        reference.generate(ref_inputs, max_new_tokens=4).tokens.tolist()
    assert not any(hp.fwd_hooks for hp in model.hook_dict.values())


def _assert_same_sweep(model, reference, atol=0.0):
    """The fast patching path (resume from cached residuals, KV prefixes, last block at the final position)."""
    pairs = make_count_pairs(3, seed=0, size=56)
    ours = patch_layer_head(model, build_pair_batch(model, pairs))
    theirs = patch_layer_head(reference, build_pair_batch(reference, pairs))
    torch.testing.assert_close(ours.per_pair_logit_diff, theirs.per_pair_logit_diff, atol=atol, rtol=0)


def test_every_entry_cpu_is_the_single_device_model(checkpoint, reference):
    model = HookedVLM.from_pretrained(checkpoint, device_map=module_names())
    _assert_same_model(model, reference)


def test_disk_offloaded_blocks_and_head(checkpoint, reference, tmp_path):
    model = HookedVLM.from_pretrained(checkpoint, device_map=module_names(disk_layers=(1, 3), disk_head=True),
                                      offload_folder=str(tmp_path))
    assert model.device_map[f"model.language_model.layers.{1}"] == "disk"
    assert model.blocks[1].ln1.w.device.type == "meta"  # streamed from disk on each call
    _assert_same_model(model, reference)
    _assert_same_sweep(model, reference)
    with pytest.raises(ValueError, match="placed across devices by device_map"):
        model.to("cpu")


def test_auto_map_under_a_memory_budget_offloads_and_matches(checkpoint, reference, tmp_path):
    model = HookedVLM.from_pretrained(checkpoint, device_map="auto", max_memory={"cpu": 400_000},
                                      offload_folder=str(tmp_path))
    assert set(map(str, model.device_map.values())) == {"cpu", "disk"}
    inputs, ref_inputs = _inputs(model), _inputs(reference)
    with torch.no_grad():
        torch.testing.assert_close(model(inputs), reference(ref_inputs), atol=0, rtol=0)


def test_device_and_device_map_are_exclusive(checkpoint):
    with pytest.raises(ValueError, match="either device .* or device_map"):
        HookedVLM.from_pretrained(checkpoint, device="cpu", device_map="auto")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU: CPU+GPU split of one model")
def test_accelerate_cpu_gpu_map_matches_the_single_device_logits(checkpoint, reference):
    # blocks 0-1, vision, embedding and head on GPU 0; blocks 2-3 on "cpu", which accelerate
    # offloads next to a GPU (weights kept in CPU memory, streamed to the GPU on each call)
    placement = {name: 0 for name in module_names()}
    for layer in (2, 3):
        placement[f"model.language_model.layers.{layer}"] = "cpu"
    model = HookedVLM.from_pretrained(checkpoint, device_map=placement)
    assert model.input_device.type == "cuda" and model.blocks[2].ln1.w.device.type == "meta"
    _assert_same_model(model, reference, atol=1e-4)
    _assert_same_sweep(model, reference, atol=1e-4)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU: CPU+GPU split of one model")
def test_blocks_on_cpu_and_gpu_move_the_residual_between_them(checkpoint, reference):
    # a placement by hand (no accelerate hooks): vision, embedding, blocks 0-1 on the CPU; blocks
    # 2-3, the final norm and the head on the GPU; every block computes where its weights are
    model = HookedVLM.from_pretrained(checkpoint)
    lm = model.hf_model.model.language_model
    for module in (*lm.layers[2:], lm.norm, model.hf_model.lm_head):
        module.to("cuda")
    assert model.input_device.type == "cpu" and model.blocks[3].attn.q_proj.weight.device.type == "cuda"
    _assert_same_model(model, reference, atol=1e-4)
    _assert_same_sweep(model, reference, atol=1e-4)

"""TransformerLens's direct-path patching is refused on a HookedVLM before any forward, naming vlens's exact
edge patching (`vlens.circuits.path_patch`, checked against a plain-hooks reference in
tests/unit/test_circuits_exact.py), and leaves the model as it was."""

from __future__ import annotations

import pytest
import torch
import transformer_lens.patching as tl_patching

from tests.helpers.models import tiny_vlm
from vlens.testing import random_image


def test_direct_path_patching_is_refused_with_the_alternative_and_leaves_nothing_behind():
    model = tiny_vlm("qwen2_5_vl", n_kv_heads=4)  # as many K/V heads as heads: TL's own GQA refusal aside
    model.eval()
    clean = model.prepare(images=[random_image(56, 56, seed=0)], prompts=["How many dots are there?"])
    corrupt = model.prepare(images=[random_image(56, 56, seed=1)], prompts=["How many dots are there?"])
    before = model(clean)
    _, clean_cache = model.run_with_cache(clean)
    _, corrupt_cache = model.run_with_cache(corrupt)
    forwards = []
    handle = model.register_forward_hook(lambda *args: forwards.append(1))
    try:
        for run in (lambda: tl_patching.get_act_patch_direct_path(
                        model, corrupt, clean_cache, corrupt_cache, lambda logits: logits[:, -1].sum(), 0, 1,
                        component="q", verbose=False),
                    lambda: tl_patching.get_act_patch_direct_path_all_sources(
                        model, corrupt, clean_cache, corrupt_cache, lambda logits: logits[:, -1].sum(),
                        verbose=False)):
            with pytest.raises(NotImplementedError, match=r"vlens\.circuits\.path_patch.*L0H1->L2H3\.q"):
                run()
    finally:
        handle.remove()
    assert forwards == []  # refused before any forward
    assert not getattr(model.cfg, "use_split_qkv_input", False)
    assert all(not point.fwd_hooks and not point.bwd_hooks for point in model.hook_dict.values())
    assert torch.equal(model(clean), before)

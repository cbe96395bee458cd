"""TransformerLens's `tools.analysis.attribution_patch` takes `VLMInputs` (their `ndim` and row slices are
what it reads): each MLP node's score equals the first-order estimate computed here by hand,
(mlp_out_clean - mlp_out_corrupt) . d metric / d mlp_out on the corrupt run."""

from __future__ import annotations

import pytest
import torch

from tests.helpers.models import tiny_vlm
from vlens.testing import random_image
from vlens.utils.errors import UserInputError

analysis = pytest.importorskip("transformer_lens.tools.analysis.attribution_patching")


def test_attribution_patch_on_vlm_inputs_equals_the_hand_computed_estimate():
    model = tiny_vlm("qwen2_5_vl", fresh=True).eval()
    clean, corrupt = (model.prepare(images=[random_image(56, 56, seed)], prompts=["How many dots are there?"])
                      for seed in (1, 2))
    three, five = 3, 5

    def metric(logits):
        return logits[0, -1, three] - logits[0, -1, five]

    result = analysis.attribution_patch(model, clean, corrupt, metric)
    layer = model.cfg.n_layers - 1
    hook = f"blocks.{layer}.hook_mlp_out"
    with torch.no_grad():
        _, cache = model.run_with_cache(clean, names_filter=hook)
    saved = {}

    def keep(x, hook):
        x.retain_grad()
        saved["act"] = x
        return x

    with torch.enable_grad():
        metric(model.run_with_hooks(corrupt, fwd_hooks=[(hook, keep)])).backward()
    expected = ((cache[hook] - saved["act"].detach()) * saved["act"].grad)[0].sum(-1)  # [pos]
    got = torch.tensor([score for node, score in sorted(result.node_scores.items(), key=lambda item: item[0].position)
                        if node.kind == "mlp_out" and node.layer == layer])
    assert got.shape == expected.shape and expected.abs().max() > 1e-4
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-4)


def test_vlm_inputs_slice_by_rows_like_token_tensors():
    model = tiny_vlm("qwen2_5_vl")
    both = model.prepare(images=[random_image(56, 56, 1), random_image(56, 56, 2)],
                         prompts=["How many dots are there?"] * 2)
    assert both.ndim == 2
    second = both[1:2]
    alone = model.prepare(images=[random_image(56, 56, 2)], prompts=["How many dots are there?"])
    with torch.no_grad():
        torch.testing.assert_close(model(second), model(alone), atol=1e-5, rtol=0)
    with pytest.raises(UserInputError, match="slice of rows"):
        both[0]

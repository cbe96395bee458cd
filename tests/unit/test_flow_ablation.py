"""Object-token ablation (`vlens.flow.ablation`) on hand-computed cases: the exact McNemar test, the
values written at the vision output and at a decoder layer (zero, mean, resample),
the baselines' token sets, and the one-edge model losing its answer when every image token is zeroed."""

from __future__ import annotations

import pytest
import torch

import vlens
from tests.helpers.models import tiny_vlm
from tests.helpers.one_edge import flow_examples, one_edge_model, plant_answers
from tests.helpers.results import without_provenance
from vlens.flow.ablation import (
    ablate_tokens,
    ablation_hook,
    choose_tokens,
    mcnemar_exact,
    site_activations,
)
from vlens.utils.errors import UserInputError

torch.set_num_threads(1)
CONFIG = dict(n_layers=3, d_model=40, n_heads=4, n_kv_heads=2, d_mlp=24)


def test_mcnemar_exact_by_hand():
    assert mcnemar_exact([1, 1, 1, 1, 1], [0, 0, 0, 0, 0]) == {"a_only": 5, "b_only": 0, "p": 0.0625}
    # 3 vs 1 discordant: p = 2 * (C(4,0) + C(4,1)) / 16 = 0.625
    assert mcnemar_exact([1, 1, 1, 0, 1, 0], [0, 0, 0, 1, 1, 0])["p"] == pytest.approx(0.625)
    assert mcnemar_exact([1, 0], [1, 0])["p"] == 1.0
    with pytest.raises(UserInputError, match="paired"):
        mcnemar_exact([1], [1, 0])


def _captured(model, inputs, hook, name):
    seen = {}

    def capture(x, hook):
        seen["x"] = x.detach().clone()

    with torch.no_grad(), model.hooks(fwd_hooks=[hook, (name, capture)]):
        model(inputs)
    return seen["x"]


@pytest.mark.parametrize("at", ["vision", 1])
@pytest.mark.parametrize("how", ["zero", "mean", "resample"])
def test_written_values_by_hand(at, how):
    model = tiny_vlm("qwen2_5_vl", **CONFIG)
    batch = flow_examples()
    inputs, _, objects = batch.encode(model, range(3))
    acts = site_activations(model, inputs, at)
    positions = [objects[0].positions, objects[1].positions[:1], inputs.regions.image[2][-2:]]
    name, hook = ablation_hook(at, inputs, positions, how, acts)
    edited = _captured(model, inputs, (name, hook), name)
    mean = torch.cat(acts).mean(0)
    offset = 0
    for row in range(3):
        image = inputs.regions.image[row]
        got = edited[offset:offset + len(image)] if at == "vision" else edited[row, image]
        offset += len(image)
        chosen = torch.isin(image, positions[row])
        index = chosen.nonzero().flatten()
        if how == "zero":
            expected = torch.zeros(len(index), acts[row].shape[-1])
        elif how == "mean":
            expected = mean.expand(len(index), -1)
        else:
            other = acts[(row + 1) % 3]
            expected = other[index % other.shape[0]]
        torch.testing.assert_close(got[chosen], expected, atol=1e-6, rtol=0)
        torch.testing.assert_close(got[~chosen], acts[row][~chosen], atol=1e-6, rtol=0)  # the rest untouched


def test_token_sets_are_disjoint_and_the_same_size():
    model = tiny_vlm("qwen2_5_vl", **CONFIG)
    batch = flow_examples(scale=3)
    inputs, _, objects = batch.encode(model, range(3))
    acts = site_activations(model, inputs, "vision")
    sets = choose_tokens(inputs, objects, acts, 1, torch.Generator().manual_seed(0))
    for row in range(3):
        obj, rnd, reg = sets.object[row], sets.random[row], sets.register[row]
        assert len(obj) == len(rnd) == len(reg) >= len(objects[row])
        assert torch.equal(obj, objects[row].buffer(1).positions.sort().values)
        assert not torch.isin(rnd, obj).any() and not torch.isin(reg, obj).any()
        norms = acts[row].norm(dim=-1)
        outside = ~torch.isin(inputs.regions.image[row], obj)
        assert norms[torch.isin(inputs.regions.image[row], reg)].min() >= norms[outside].sort().values[-len(reg)]


def test_one_edge_model_loses_the_answer_without_image_tokens():
    model = one_edge_model(carrier=1, n_layers=2)
    batch = flow_examples()
    inputs, answers, _ = batch.encode(model, range(3))
    plant_answers(model, inputs, answers.tolist(), scale=300.0)
    acts = site_activations(model, inputs, "vision")
    name, hook = ablation_hook("vision", inputs, list(inputs.regions.image), "zero", acts)
    with torch.no_grad(), model.hooks(fwd_hooks=[(name, hook)]):
        logits = model(inputs)
    final = logits[torch.arange(3), inputs.regions.final]
    assert torch.equal(final, torch.zeros_like(final))


def test_ablate_tokens_end_to_end_loads_back(tmp_path):
    model = tiny_vlm("qwen2_5_vl", **CONFIG)
    result = ablate_tokens(model, flow_examples(scale=3), how="resample", at=2, buffer=1, batch_size=2, progress=False)
    assert set(result.correct) == {"clean", "object", "random", "register"}
    assert set(result.tests) == {"object_vs_random", "object_vs_register"}
    assert all(0 <= result.accuracy[c]["low"] <= result.accuracy[c]["value"] <= result.accuracy[c]["high"] <= 1
               for c in result.accuracy)
    result.save(tmp_path)
    assert without_provenance(vlens.load_result(tmp_path).to_dict()) == result.to_dict()
    assert "McNemar" in result.report()
    with pytest.raises(UserInputError, match="at="):
        ablate_tokens(model, flow_examples(), at=9, progress=False)
    with pytest.raises(UserInputError, match="batch_size"):
        ablate_tokens(model, flow_examples(), how="resample", batch_size=1, progress=False)

"""The viewer's dataset examples: each feature's top image patches and text tokens over a set of prompts equal a
brute-force maximum over every prompt run alone (batched prompts of different lengths: padding removed from the
positions); each hit renders (a patch of the image around the token's box, a text token in context)."""

from __future__ import annotations

import pytest
import torch

from tests.helpers.models import tiny_vlm
from tests.unit.test_graphs import random_transcoders
from vlens.graphs import ExampleSettings, dataset_examples
from vlens.testing import random_image
from vlens.transcoders.activations import mlp_pairs
from vlens.utils.errors import UserInputError

torch.set_num_threads(1)
QUESTIONS = ["How many dots are there?", "Count the dots.", "What colour is the largest shape in this picture?",
             "Dots?", "How many red dots are in the image?"]


def brute_force(model, tc, examples, features):
    """Every prompt alone: per feature and kind (image, text tokens), {(prompt, position): activation > 0}."""
    found = {f"L{layer}F{feature}": {"image": {}, "text": {}} for layer, feature in features}
    for index, (image, text) in enumerate(examples):
        inputs = model.prepare(images=[[image]], prompts=[text])
        xs, _ = mlp_pairs(model, inputs, tc.cfg.layers)
        is_image = inputs.token_regions.mask("image", inputs.input_ids.shape[1])[0]
        for layer, feature in features:
            i = tc.cfg.layers.index(layer)
            for pos, value in enumerate(tc.encode(i, xs[i][0])[:, feature].tolist()):
                if value > 0:
                    found[f"L{layer}F{feature}"]["image" if is_image[pos] else "text"][(index, pos)] = value
    return found


def test_top_examples_equal_a_brute_force_max_over_the_set():
    model = tiny_vlm("qwen2_5_vl")
    tc = random_transcoders(model, kind="plt", d_tc=6, seed=4)
    examples = [(random_image(seed=20 + i), q) for i, q in enumerate(QUESTIONS)]
    features = [(0, 1), (0, 4), (1, 2), (1, 5)]
    k = 4
    got = dataset_examples(model, tc, examples, features, ExampleSettings(top_k=k, prompts_per_chunk=2, context=2))
    expected = brute_force(model, tc, examples, features)
    assert got["n_prompts"] == len(examples) and set(got["features"]) == set(expected)
    n_hits = 0
    for key, kinds in expected.items():
        for kind, every in kinds.items():
            shown = got["features"][key][kind]
            top = sorted(every.values(), reverse=True)[:k]
            assert [h["activation"] for h in shown] == pytest.approx(top, abs=1e-5), (key, kind)
            for hit in shown:  # each hit is where it says (identical prompt prefixes tie: either may be shown)
                assert every[(hit["prompt"], hit["position"])] == pytest.approx(hit["activation"], abs=1e-5)
                if kind == "image":
                    assert hit["src"].startswith("data:image/png;base64,") and len(hit["box"]) == 4
                else:
                    assert hit["context"][hit["focus"]] == hit["token"]
            n_hits += len(shown)
    assert n_hits > 10


def test_bad_requests_say_what_to_fix():
    model = tiny_vlm("qwen2_5_vl")
    tc = random_transcoders(model, kind="plt", d_tc=6, seed=4, layers=(1,))
    examples = [(random_image(seed=1), "Dots?")]
    with pytest.raises(UserInputError, match="no transcoder feature L0F1"):
        dataset_examples(model, tc, examples, [(0, 1)])
    with pytest.raises(UserInputError, match="no transcoder feature L1F9"):
        dataset_examples(model, tc, examples, [(1, 9)])
    with pytest.raises(UserInputError, match="at least one prompt"):
        dataset_examples(model, tc, [], [(1, 1)])

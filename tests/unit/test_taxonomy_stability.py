"""HeadLens classes relative to chance: image attention over the image-token share, and each class's
stability over bootstrap resamples of the examples (against a loop over the resamples)."""

from __future__ import annotations

import math

import pytest
import torch

from tests.helpers.headlens_models import tiny_model
from vlens import SweepOptions
from vlens.lens.head_scores import EXAMPLE_VALUES, HeadScores, compute_head_scores, scores_from_examples
from vlens.lens.headlens import HeadLensOutput
from vlens.lens.taxonomy import HEAD_CLASSES, classify_head, classify_heads
from vlens.testing import random_image
from vlens.utils.stats import bootstrap_counts

torch.set_num_threads(1)


class ShareLens:
    """Head L0H0 puts `mass` on the image, whose tokens are `share` of the keys; every other head 0.5."""

    def __init__(self, model, mass, share):
        self.token = model.tokenizer.convert_tokens_to_ids("red")
        self.mass, self.share = torch.tensor(mass), torch.tensor(share)
        self.shape = (model.cfg.n_layers, model.cfg.n_heads)

    def run(self, inputs, positions="final", k=10):
        n, (layers, heads) = len(self.mass), self.shape
        mass = torch.full((n, 1, layers, heads), 0.5)
        mass[:, 0, 0, 0] = self.mass
        return HeadLensOutput(layers=list(range(layers)), positions=inputs.regions.final.view(-1, 1),
                              top_ids=torch.full((n, 1, layers, heads, 1), self.token),
                              top_logits=torch.zeros(n, 1, layers, heads, 1), model_top1=torch.full((n, 1), self.token),
                              image_attention=mass, image_share=self.share.view(n, 1),
                              has_image=torch.ones(n, dtype=torch.bool))


def test_image_attention_is_read_against_the_image_token_share():
    model = tiny_model("Qwen2_5_VLForConditionalGeneration")
    samples = [(random_image(56, 56, i), "How many dots are there?", {}) for i in range(3)]
    lens = ShareLens(model, mass=[0.3, 0.6, 0.9], share=[0.3, 0.6, 0.9])  # uniform attention
    scores = compute_head_scores(model, samples, lens, k=1, vocabularies={"visual": [], "number": []},
                                 options=SweepOptions(batch_size=3, progress=False))
    assert scores.head(0, 0)["image_attention"] == pytest.approx(0.6)
    assert scores.head(0, 0)["image_attention_ratio"] == pytest.approx(1.0)  # uniform = 1
    assert scores.head(0, 1)["image_attention_ratio"] == pytest.approx((0.5 / 0.3 + 0.5 / 0.6 + 0.5 / 0.9) / 3)
    assert scores.image_share == pytest.approx(0.6)
    # a head with 0.69 of its attention on a prompt that is 69% image tokens routes nothing extra
    assert classify_head({"image_attention": 0.69, "image_attention_ratio": 1.0, "cter": 0.5}) == "cross-modal routing"
    assert classify_head({"image_attention": 0.69, "image_attention_ratio": 0.99, "cter": 0.5}) == "other"


def _planted_scores(n: int = 30) -> HeadScores:
    """Three heads: VGS 1.0 on every example (grounding, always), VGS 0.35 or 0.26 in equal parts
    (mean 0.305, one standard error above the 0.3 threshold: unstable), VGS 0 (other, always)."""
    per_example = {name: torch.zeros(n, 1, 3) for name in EXAMPLE_VALUES}
    for name in ("existence_response", "_difficulty_crowded", "_difficulty_uncrowded"):
        per_example[name][:] = float("nan")
    per_example["vgs"][:, 0, 0] = 1.0
    per_example["vgs"][:, 0, 1] = torch.tensor([0.35, 0.26] * (n // 2))
    per_example["image_attention_ratio"][:] = 0.5
    return HeadScores(scores=scores_from_examples(per_example), top_tokens={}, n_examples=n, k=10,
                      per_example=per_example)


def test_class_stability_equals_a_loop_over_the_resamples():
    scores = _planted_scores()
    taxonomy = classify_heads(scores, n_resamples=60, seed=5)
    assert [taxonomy.classes[(0, h)] for h in range(3)] == ["visual grounding", "visual grounding", "other"]
    counts = bootstrap_counts(scores.n_examples, 60, 5).long()
    same = torch.zeros(3)
    grounding = []
    for row in counts:  # each resample as an explicit list of examples, classified head by head
        rows = torch.arange(scores.n_examples).repeat_interleave(row)
        resampled = scores_from_examples({name: v[rows] for name, v in scores.per_example.items()})
        classes = [classify_head({name: float(v[0, h]) for name, v in resampled.items()}) for h in range(3)]
        same += torch.tensor([c == taxonomy.classes[(0, h)] for h, c in enumerate(classes)], dtype=torch.float)
        grounding.append(classes.count("visual grounding"))
    torch.testing.assert_close(taxonomy.stability.per_head[0].float(), same / 60)
    low, high = torch.tensor(grounding, dtype=torch.float64).quantile(torch.tensor([0.025, 0.975],
                                                                                   dtype=torch.float64))
    assert taxonomy.stability.counts["visual grounding"] == (math.floor(low), math.ceil(high))  # whole heads
    assert float(taxonomy.stability.per_head[0, 0]) == 1.0 and float(taxonomy.stability.per_head[0, 2]) == 1.0
    assert 0.1 < float(taxonomy.stability.per_head[0, 1]) < 0.9  # the near-threshold head flips
    assert taxonomy.stability.unstable.tolist() == [[False, True, False]]
    data = taxonomy.to_dict()
    assert data["heads"][1]["stable"] is False and data["heads"][0]["stability"] == 1.0
    assert data["counts_interval"]["visual grounding"][0] >= 1 and data["stability"]["n_unstable"] == 1
    assert "(unstable)" in taxonomy.table(include_other=True)
    assert taxonomy.stable_heads_of("visual grounding") == [(0, 0)]
    figure = taxonomy.plot()
    assert figure.data[0].text[0][1] == "?" and "unstable" in figure.layout.title.text
    assert HEAD_CLASSES.index("visual grounding") == figure.data[0].z[0][0]

"""Head scores on hand-made HeadLens outputs, vocabularies through real tokenizers, the taxonomy rules."""

from __future__ import annotations

import math

import pytest
import torch

from tests.helpers.headlens_models import tiny_model
from vlens import SweepOptions
from vlens.lens.head_scores import SCORE_NAMES, HeadScores, compute_head_scores
from vlens.lens.headlens import HeadLensOutput
from vlens.lens.taxonomy import HEAD_CLASSES, TaxonomyThresholds, classify_head, classify_heads
from vlens.lens.vocabularies import DEFAULT_VOCABULARIES, vocabulary_token_ids, word_token_ids
from vlens.testing import random_image, word_level_tokenizer
from vlens.utils.errors import UserInputError

torch.set_num_threads(1)
QWEN = "Qwen2_5_VLForConditionalGeneration"


# ------------------------------------------------------------------ vocabularies
def test_word_level_vocabularies_skip_unknown_words():
    tokenizer = word_level_tokenizer()
    ids = vocabulary_token_ids(tokenizer)
    names = {name: set(tokenizer.convert_ids_to_tokens(sorted(v))) for name, v in ids.items()}
    assert names["visual"] == {"red", "blue", "green", "colour", "shape", "dots"}
    assert names["number"] == {str(i) for i in range(11)}
    assert names["existence"] == {"1", "yes"}
    assert names["difficulty"] == set()  # no such word: the difficulty score is then undefined
    assert set(DEFAULT_VOCABULARIES) == {"visual", "number", "existence", "difficulty"}


def test_a_given_vocabulary_names_the_words_the_tokenizer_cannot_spell():
    tokenizer = word_level_tokenizer()
    # before: "zebra" and "xylophone" counted through nothing, and the visual score silently covered one word
    with pytest.raises(UserInputError, match="vocabulary 'visual': the tokenizer knows no spelling of 'zebra', "
                                             "'xylophone' \\(2 of 3 words"):
        vocabulary_token_ids(tokenizer, {**DEFAULT_VOCABULARIES, "visual": ["red", "zebra", "xylophone"]})
    with pytest.raises(UserInputError, match="must be a list of words"):
        vocabulary_token_ids(tokenizer, {"visual": "red"})
    # the built-in lists (kept as they are next to a given one) skip what a small tokenizer lacks
    ids = vocabulary_token_ids(tokenizer, {**DEFAULT_VOCABULARIES, "visual": ["red", "blue"]})
    assert ids["difficulty"] == set() and len(ids["visual"]) == 2


def test_multi_token_words_count_through_their_first_token():
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE(unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    corpus = ["pen pen pen tag on", "red red red", "pen tag"] * 20
    backend.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=40, special_tokens=["[UNK]"]))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]")
    pieces = tokenizer("pentagon", add_special_tokens=False)["input_ids"]
    assert len(pieces) > 1 and tokenizer.decode([pieces[0]]) == "pen"
    ids = word_token_ids(tokenizer, ["pentagon", "red", "zebra"])  # "zebra" has unknown letters: skipped
    assert ids == {pieces[0], tokenizer.convert_tokens_to_ids("red")}
    with pytest.raises(ValueError, match="non-empty"):
        word_token_ids(tokenizer, [" "])


# ------------------------------------------------------------------ scores on a hand-made lens output
class ScriptedLens:
    """Returns fixed top tokens / answers / image attention for one batch of 4 (2 layers x 4 heads)."""

    def __init__(self, tokenizer):
        t = tokenizer.convert_tokens_to_ids
        other = [t("3"), t("red")]
        head00 = [[t("red"), t("blue")], [t("red"), t("3")], [t("no"), t("yes")], [t("1"), t("2")]]
        ids = torch.tensor(other).expand(4, 1, 2, 4, 2).clone()
        ids[:, 0, 0, 0] = torch.tensor(head00)
        self.ids = ids
        self.answers = torch.tensor([[t("3")], [t("3")], [t("yes")], [t("3")]])
        self.mass = torch.full((4, 1, 2, 4), 0.5)
        self.mass[:, 0, 0, 0] = torch.tensor([0.1, 0.2, 0.3, 0.9])

    def run(self, inputs, positions="final", k=10):
        return HeadLensOutput(layers=[0, 1], positions=inputs.regions.final.view(-1, 1), top_ids=self.ids,
                              top_logits=torch.zeros(self.ids.shape), model_top1=self.answers,
                              image_attention=self.mass, image_share=torch.zeros(4, 1),
                              has_image=torch.tensor([True, True, True, False]))


def test_scores_match_hand_computed_values():
    model = tiny_model(QWEN)
    image = random_image(56, 56, 0)
    records = [{"objects": [{}] * 8}, {"objects": [{}] * 2}, {"count": 9}, {}]
    samples = [(image if i < 3 else None, "How many dots are there?", r) for i, r in enumerate(records)]
    vocab = {"visual": ["red", "blue"], "number": ["1", "2", "3"], "existence": ["1", "yes"], "difficulty": ["no"]}
    scores = compute_head_scores(model, samples, ScriptedLens(model.tokenizer), k=2, vocabularies=vocab,
                                 large_count=7, options=SweepOptions(batch_size=4, progress=False))
    head = scores.head(0, 0)
    assert head["vgs"] == pytest.approx((1 + 0.5 + 0 + 0) / 4)
    assert head["cter"] == pytest.approx((0 + 0.5 + 0 + 1) / 4)
    assert head["image_attention"] == pytest.approx((0.1 + 0.2 + 0.3) / 3)  # the text-only row is left out
    assert head["answer_alignment"] == 0.0
    assert head["existence_response"] == pytest.approx(1 / 3)  # rows whose answer is not "1"/"yes": 0, 1, 3
    # top-1 "no" on crowded rows 0 (8 objects: no), 2 (9: yes) = 1/2; on the uncrowded row 1 (2): 0/1
    assert head["difficulty_response"] == pytest.approx(0.5 - 0.0)
    other = scores.head(1, 3)
    assert other["answer_alignment"] == pytest.approx(0.75) and other["cter"] == 0.5 and other["vgs"] == 0.5
    assert scores.top_tokens[(1, 3)] == [("3", 4), ("red", 4)]
    assert scores.vocab_sizes == {"visual": 2, "number": 3, "existence": 2, "difficulty": 1}


def test_undefined_scores_are_nan_and_none_in_json():
    model = tiny_model(QWEN)
    samples = [(random_image(56, 56, i), "How many dots are there?", {}) for i in range(4)]
    scores = compute_head_scores(model, samples, ScriptedLens(model.tokenizer), k=2,
                                 options=SweepOptions(batch_size=4, progress=False))
    assert torch.isnan(scores.difficulty_response).all()  # the test tokenizer has no difficulty word
    assert scores.to_dict()["heads"][0]["scores"]["difficulty_response"] is None


# ------------------------------------------------------------------ taxonomy
def _scores(**values) -> dict:
    out = dict.fromkeys(SCORE_NAMES, 0.0)
    out.update(values)
    return out


@pytest.mark.parametrize("values, expected", [
    (dict(existence_response=0.6), "awareness"),
    (dict(difficulty_response=0.3), "awareness"),
    (dict(answer_alignment=0.9, image_attention_ratio=0.2, cter=0.9), "counting aggregation"),
    (dict(answer_alignment=0.9, image_attention_ratio=1.2, cter=0.9), "cross-modal routing"),
    (dict(image_attention_ratio=1.0, cter=0.3), "cross-modal routing"),
    (dict(image_attention_ratio=1.3, cter=0.2, vgs=0.4), "visual grounding"),
    # 0.9 of the attention on image tokens that are 95% of the keys is less than uniform: not routing
    (dict(image_attention=0.9, image_attention_ratio=0.9 / 0.95, cter=0.9), "other"),
    (dict(answer_alignment=0.9, image_attention=0.1, image_attention_ratio=0.5), "other"),
    (dict(vgs=0.29), "other"),
    (dict(existence_response=float("nan"), difficulty_response=None, vgs=0.5), "visual grounding"),
])
def test_classification_rules(values, expected):
    assert classify_head(_scores(**values)) == expected


def test_chance_correction_of_token_shares():
    grid = {name: torch.zeros(1, 2) for name in SCORE_NAMES}
    grid["image_attention"][:] = 0.9
    grid["image_attention_ratio"][:] = 1.3
    grid["cter"][0] = torch.tensor([0.6, 0.9])  # half the vocabulary are numbers: chance 0.5
    scores = HeadScores(scores=grid, top_tokens={}, n_examples=1, k=10, vocab_sizes={"number": 50, "visual": 0},
                        d_vocab=100)
    corrected = classify_heads(scores)  # lifts (0.6 - 0.5) / 0.5 = 0.2 < 0.3 and 0.8
    assert [corrected.classes[(0, 0)], corrected.classes[(0, 1)]] == ["other", "cross-modal routing"]
    assert corrected.to_dict()["chance"] == {"cter": 0.5, "vgs": 0.0}
    raw = classify_heads(scores, TaxonomyThresholds(chance_corrected=False))
    assert raw.classes[(0, 0)] == "cross-modal routing"


def test_thresholds_are_configurable_and_validated():
    assert classify_head(_scores(vgs=0.2), TaxonomyThresholds(grounding_vgs_min=0.2)) == "visual grounding"
    with pytest.raises(ValueError, match="grounding_vgs_min"):
        TaxonomyThresholds(grounding_vgs_min=1.5)
    assert TaxonomyThresholds(routing_image_ratio_min=1.4).routing_image_ratio_min == 1.4  # a ratio may exceed 1
    with pytest.raises(ValueError, match="relative to the image-token share"):
        TaxonomyThresholds.from_dict({"routing_image_min": 0.3})


def test_taxonomy_table_figure_and_json():
    grid = {name: torch.zeros(2, 3) for name in SCORE_NAMES}
    grid["vgs"][0, 1] = 0.8
    grid["image_attention"][1, 0], grid["cter"][1, 0] = 0.6, 0.5
    grid["image_attention_ratio"][:] = 0.5  # neither routing (>= 1) nor aggregation (<= 0.25) ...
    grid["image_attention_ratio"][1, 0], grid["image_attention_ratio"][1, 2] = 1.2, 0.1  # ... but these
    grid["answer_alignment"][1, 2] = 1.0
    grid["difficulty_response"][:] = math.nan
    scores = HeadScores(scores=grid, top_tokens={(0, 1): [("red", 5)]}, n_examples=5, k=10)
    taxonomy = classify_heads(scores)
    assert taxonomy.counts() == {"visual grounding": 1, "cross-modal routing": 1, "counting aggregation": 1,
                                 "awareness": 0, "other": 3}
    assert taxonomy.heads_of("counting aggregation") == [(1, 2)]
    table = taxonomy.table()
    assert "| visual grounding | L0H1 | - | 0.80 |" in table and "'red'" in table and "L0H0" not in table
    figure = taxonomy.plot()
    z = figure.data[0].z
    assert [list(row) for row in z] == taxonomy.class_grid().tolist()
    assert z[0][1] == HEAD_CLASSES.index("visual grounding")
    with_vgs = taxonomy.plot(value="vgs")
    assert float(with_vgs.data[0].customdata[0][1][1]) == pytest.approx(0.8)
    with pytest.raises(ValueError, match="value must be one of"):
        taxonomy.plot(value="nope")
    heads = taxonomy.to_dict()["heads"]
    assert heads[1] == {"layer": 0, "head": 1, "class": "visual grounding", "scores": scores.head(0, 1),
                        "top_tokens": [["red", 5]]}
    assert heads[0]["scores"]["difficulty_response"] is None

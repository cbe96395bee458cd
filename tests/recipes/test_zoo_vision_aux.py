"""The optional dense vision objective of the embedded model's recipe."""

from __future__ import annotations

import json
from functools import partial

import numpy as np
import pytest
import torch

from vlens.recipes.embedded.recipe import build_untrained
from vlens.recipes.embedded.train import TrainSettings, train_model
from vlens.recipes.embedded.training_set import render_training_set
from vlens.recipes.embedded.vision_aux import (
    BACKGROUND,
    COLOUR_CLASSES,
    IGNORE,
    SHAPE_CLASSES,
    VisionAuxHeads,
    captured_image_tokens,
    cell_labels,
)


def test_cell_labels_by_hand():
    # 60 px image, 3 x 3 cells of 20 px: a star's box covers cells (0,0),(0,1),(1,0),(1,1)
    # mostly in (0,1); a red square sits in cell (2,2); a sliver of it touches (2,1) only.
    record = {
        "image_size": 60,
        "objects": [
            {"shape": "star", "color": "blue", "bbox": [15, 5, 35, 25]},
            {"shape": "square", "color": "red", "bbox": [39.8, 42, 58, 58]},
            {"shape": "tree", "color": "green", "bbox": [2, 42, 18, 58]},  # a SynReal shape
        ],
    }
    shape, colour = cell_labels(record, grid=3).reshape(2, 3, 3)
    star, square = SHAPE_CLASSES.index("star"), SHAPE_CLASSES.index("square")
    blue, red, green = (COLOUR_CLASSES.index(c) for c in ("blue", "red", "green"))
    assert shape.tolist() == [[star, star, 0], [star, star, 0], [IGNORE, BACKGROUND, square]]
    assert colour.tolist() == [[blue, blue, 0], [blue, blue, 0], [green, BACKGROUND, red]]
    assert (cell_labels({"image_size": 60}, grid=3) == IGNORE).all()  # no object list: no labels


def test_heads_ignore_unlabelled_tokens_and_hook_is_removed_on_error():
    heads = VisionAuxHeads(width=8, seed=0)
    tokens = torch.randn(4, 8)
    assert heads.loss(tokens, torch.full((2, 4), IGNORE)).item() == 0.0
    labels = torch.tensor([[1, IGNORE, 0, 2], [IGNORE] * 4])
    expected = torch.nn.functional.cross_entropy(heads.shape(tokens[[0, 2, 3]]), labels[0, [0, 2, 3]])
    torch.testing.assert_close(heads.loss(tokens, labels), expected)

    _, _, model = build_untrained(seed=0)
    with pytest.raises(RuntimeError), captured_image_tokens(model):
        raise RuntimeError("boom")
    assert not model.model.visual._forward_hooks


def test_training_with_the_vision_objective_lowers_it(tmp_path):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        tokenizer, processor, model = build_untrained(seed=2)
        rendered = render_training_set(processor, 16, seed=2, progress=False, mix={"shape": 1.0})
        assert rendered.cell_labels.shape == (16, 2, 36)
        assert (rendered.cell_labels[:, 0] > BACKGROUND).any()
        settings = TrainSettings(steps=12, batch_size=8, warmup_steps=1, learning_rate=3e-3, log_every=1)
        settings.vision_aux_weight, settings.seed = 1.0, 2
        log = tmp_path / "log.jsonl"
        ids = (tokenizer.pad_token_id, processor.image_token_id)
        train = partial(
            train_model, model, rendered.examples, rendered.images, settings, *ids, log, progress=False
        )
        train(cell_labels=rendered.cell_labels)
        with pytest.raises(ValueError, match="needs cell_labels"):
            train()
    finally:
        torch.set_num_threads(threads)
    records = [json.loads(line) for line in log.read_text().splitlines()]
    aux = [record["vision_aux_loss"] for record in records if "vision_aux_loss" in record]
    assert len(aux) == 12 and np.mean(aux[-3:]) < np.mean(aux[:3])
    assert not model.model.visual._forward_hooks

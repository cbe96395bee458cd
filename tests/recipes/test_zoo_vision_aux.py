"""Dense cell labels, the vision heads, and the dense objective in a language stage."""

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
    MAX_CENTRES,
    SHAPE_CLASSES,
    VisionAuxHeads,
    captured_image_tokens,
    centre_counts,
    dense_labels,
)


def _centred(centres: list[tuple[float, float]]) -> list[dict]:
    return [{"id": i, "center": list(c)} for i, c in enumerate(centres)]


def test_centres_fall_in_the_cell_of_their_pixel_and_are_not_capped():
    # 224-px image, 8 x 8 cells of 28 px: three centres in the first cell, one on each side of a border, one at the edge
    objects = _centred([(1, 1), (10, 20), (27.9, 27.9), (28, 0), (223.5, 223.5)])
    cells = centre_counts(objects, 224, 8)
    expected = np.zeros(64, dtype=np.int64)
    expected[0], expected[1], expected[63] = 3, 1, 1
    np.testing.assert_array_equal(cells, expected)
    assert cells.sum() == len(objects)  # summed over the cells: the object count


def test_centre_cells_follow_the_drawn_image_size():
    # a 448-px drawing read on a 7 x 7 grid: 64 px per cell
    cells = centre_counts(_centred([(63, 63), (64, 64), (447, 0)]), 448, 7)
    assert cells[0] == 1 and cells[8] == 1 and cells[6] == 1 and cells.sum() == 3


def test_dense_labels_by_hand():
    # 60 px image, 3 x 3 cells of 20 px. A star covers 300 px of cell (0,1) and 100 px of
    # cell (0,0); a square covers cell (2,2) and a 10-px sliver of (2,1) (< 5% of 400 px);
    # three dots have their centres in cell (1,0); a tree (a SynReal shape) fills (1,2).
    id_map = np.full((60, 60), -1, dtype=np.int16)
    id_map[5:20, 15:35] = 0  # star: 15 rows x (5 px in column 0, 15 px in column 1)
    id_map[40:60, 40:60] = 1  # square
    id_map[50:60, 39] = 1  # sliver in cell (2, 1): 10 px
    id_map[22:38, 42:58] = 2  # tree
    objects = [
        {"id": 0, "shape": "star", "color": "blue", "center": [25.0, 12.0]},
        {"id": 1, "shape": "square", "color": "red", "center": [50.0, 50.0]},
        {"id": 2, "shape": "tree", "color": "green", "center": [50.0, 30.0]},
        *(
            {"id": 3 + i, "shape": "circle", "color": "black", "center": [5.0 + 4 * i, 30.0]}
            for i in range(3)
        ),
    ]
    shape, colour, centres = dense_labels(id_map, objects, grid=3).reshape(3, 3, 3)
    star, square, tree = (SHAPE_CLASSES.index(s) for s in ("star", "square", "tree"))
    blue, red, green = (COLOUR_CLASSES.index(c) for c in ("blue", "red", "green"))
    # cell (0, 0) holds 75 star pixels (>= 5% of 400): the star too
    assert shape.tolist() == [[star, star, 0], [0, 0, tree], [0, BACKGROUND, square]]
    assert colour.tolist() == [[blue, blue, 0], [0, 0, green], [0, 0, red]]
    assert centres.tolist() == [[0, 1, 0], [3, 0, 1], [0, 0, 1]]  # three dot centres in (1, 0)
    assert MAX_CENTRES == 3


def test_dense_labels_saturate_and_ignore_unknown_names():
    id_map = np.zeros((28, 28), dtype=np.int16)
    objects = [{"id": 0, "shape": "zebra", "color": "mauve", "center": [14.0, 14.0]}] + [
        {"id": i, "shape": "circle", "color": "black", "center": [14.0, 14.0]} for i in range(1, 6)
    ]
    labels = dense_labels(id_map, objects, grid=1)
    assert labels.tolist() == [[IGNORE], [IGNORE], [MAX_CENTRES]]


def test_heads_ignore_unlabelled_tokens_and_hook_is_removed_on_error():
    heads = VisionAuxHeads(width=8, seed=0)
    tokens = torch.randn(4, 8)
    assert heads.loss(tokens, torch.full((3, 4), IGNORE)).item() == 0.0
    labels = torch.tensor([[1, IGNORE, 0, 2], [IGNORE] * 4, [IGNORE] * 4])
    expected = torch.nn.functional.cross_entropy(
        heads.heads["shape"](tokens[[0, 2, 3]]), labels[0, [0, 2, 3]]
    )
    torch.testing.assert_close(heads.loss(tokens, labels), expected)

    _, _, model = build_untrained(seed=0, image_size=56)
    with pytest.raises(RuntimeError), captured_image_tokens(model):
        raise RuntimeError("boom")
    assert not model.model.visual._forward_hooks


def test_training_with_the_vision_objective_lowers_it(tmp_path):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        tokenizer, processor, model = build_untrained(seed=2, image_size=112)
        rendered = render_training_set(processor, 16, seed=2, progress=False, mix={"shape": 1.0})
        assert rendered.cell_labels.shape == (16, 3, 16)
        assert (rendered.cell_labels[:, 0] > BACKGROUND).any()
        assert (rendered.cell_labels[:, 2].sum(1) >= 1).all()  # every image holds an object centre
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
    aux = [sum(r[f"vision_{k}_loss"] for k in ("shape", "colour", "centres")) for r in records if "step" in r]
    assert len(aux) == 12 and np.mean(aux[-3:]) < np.mean(aux[:3])
    assert not model.model.visual._forward_hooks

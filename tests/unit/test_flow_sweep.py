"""The knockout sweep (`vlens.flow.sweep`): equal to a naive loop (one example, one window, a whole
forward each); on the one-edge model only the windows holding the carrying layer move the answer, by
the hand-computed amount; the result loads back; bad edges are clear errors."""

from __future__ import annotations

import pytest
import torch

import vlens
from tests.helpers.models import tiny_vlm
from tests.helpers.one_edge import flow_examples, one_edge_model, plant_answers
from tests.helpers.results import without_provenance
from vlens.flow import knockout
from vlens.flow.batch import object_task_batch
from vlens.flow.sweep import SweepSettings, answer_scores, knockout_sweep, layer_windows, parse_edge
from vlens.utils.errors import UserInputError

torch.set_num_threads(1)


def test_windows_and_edges():
    assert layer_windows([0, 1, 2, 3], 1) == [[0], [1], [2], [3]]
    assert layer_windows([0, 1, 2, 3], 3) == [[0, 1], [0, 1, 2], [1, 2, 3], [2, 3]]
    assert layer_windows([1, 3, 5], 2) == [[1, 3], [3, 5], [5]]
    assert parse_edge("image -> final") == ("image", "final")
    for bad in ("image>final", "image->", "picture->final", "a->b->c"):
        with pytest.raises(UserInputError, match="SRC->DST"):
            parse_edge(bad)


def test_sweep_equals_a_naive_loop():
    model = tiny_vlm("qwen2_5_vl", n_layers=3, d_model=40, n_heads=4, n_kv_heads=2, d_mlp=24)
    batch = flow_examples()
    edges = ("image->final", "question->final", "object->final")
    result = knockout_sweep(model, batch, settings=SweepSettings(edges=edges, window=2, batch_size=2), progress=False)
    for i in range(len(batch)):
        inputs, answers, objects = batch.encode(model, [i])
        with torch.no_grad():
            p0, m0 = answer_scores(model(inputs)[:, -1], answers)
            assert result.clean_prob[i] == pytest.approx(float(p0[0]), abs=1e-6)
            for edge in edges:
                src, dst = edge.split("->")
                for w, layers in enumerate(result.windows):
                    with knockout(model, objects if src == "object" else src, dst, layers=layers, inputs=inputs):
                        p, m = answer_scores(model(inputs)[:, -1], answers)
                    assert result.prob_change[edge][w][i] == pytest.approx(float(((p - p0) / p0)[0]), abs=1e-4)
                    assert result.margin_change[edge][w][i] == pytest.approx(float((m - m0)[0]), abs=1e-4)


def test_one_edge_model_moves_only_in_windows_with_the_carrier(tmp_path):
    model = one_edge_model(carrier=2, n_layers=4)
    batch = flow_examples()
    inputs, answers, _ = batch.encode(model, range(len(batch)))
    plant_answers(model, inputs, answers.tolist(), scale=300.0)
    result = knockout_sweep(model, batch, edges=["image->final", "image->question"], window=2, progress=False)
    p0 = torch.tensor(result.clean_prob, dtype=torch.float64)
    assert (p0 > 0.9).all()
    expected = (1 / model.cfg.d_vocab - p0) / p0  # every final logit 0 without the edge
    for w, layers in enumerate(result.windows):
        change = torch.tensor(result.prob_change["image->final"][w], dtype=torch.float64)
        if 2 in layers:
            torch.testing.assert_close(change, expected, atol=1e-6, rtol=0)
        else:
            assert change.abs().max() < 1e-6
        assert max(abs(v) for v in result.prob_change["image->question"][w]) < 1e-6
    assert result.strongest("image->final")[0] in (1, 2)
    result.save(tmp_path)
    loaded = vlens.load_result(tmp_path)
    assert without_provenance(loaded.to_dict()) == result.to_dict()
    assert "image->final" in loaded.table()


def test_object_edges_need_boxes():
    model = tiny_vlm("qwen2_5_vl", n_layers=3, d_model=40, n_heads=4, n_kv_heads=2, d_mlp=24)
    batch = flow_examples()
    batch.examples[1].box = None
    with pytest.raises(UserInputError, match="no object box"):
        knockout_sweep(model, batch, edges=["object->final"], window=1, progress=False)
    with pytest.raises(UserInputError, match="unknown object task"):
        object_task_batch("count", 2)

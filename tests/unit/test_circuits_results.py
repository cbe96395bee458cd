"""Circuit results save, load and plot: edge scores, exact patching, circuits; the graph figure draws
layers left to right with image-region nodes on the picture, offline with the small plotly bundle."""

from __future__ import annotations

import json

import pytest
import torch

from tests.helpers.planted_circuit import plant_answers, planted_circuit_model
from vlens import SweepOptions
from vlens.circuits import (
    Circuit,
    CircuitSettings,
    EdgeScores,
    PathPatchResult,
    edge_attribution,
    extract_circuit,
    path_patch,
)
from vlens.data import make_pair
from vlens.patching import build_pair_batch, make_count_pairs
from vlens.utils.errors import UserInputError
from vlens.viz.html import CARTESIAN_TRACES, figure_page, plotly_bundle, trace_types

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def circuit():
    # the planted two-hop circuit, whose clean and corrupt answers differ clearly on every pair (a random
    # model's differ by noise: its faithfulness is NaN, as the noise-floor rule says)
    model = planted_circuit_model(seed=1)
    pairs = [make_pair(c, k, seed=10 + i, size=84) for i, (c, k) in enumerate([(1, 2), (3, 4), (5, 6), (7, 8)])]
    plant_answers(model, build_pair_batch(model, pairs))
    return model, pairs, extract_circuit(model, pairs, target=0.8, settings=CircuitSettings(ig_steps=3))


def test_circuit_round_trip_and_definitions(circuit, tmp_path):
    _, _, found = circuit
    path = found.save(tmp_path)
    data = json.loads(path.read_text())
    assert data["kind"] == "circuit" and data["scores"]["kind"] == "edge_scores"
    assert data["faithfulness"] >= 0.8 and "definition" in data
    again = Circuit.load(tmp_path)
    assert again.edge_names == found.edge_names and again.k == found.k
    assert again.faithfulness == pytest.approx(found.faithfulness)
    assert torch.equal(again.scores.scores, found.scores.scores)
    assert again.scores.thumbnail is not None and again.scores.thumbnail.size == found.scores.thumbnail.size
    assert EdgeScores.load(tmp_path).graph.edge_names == found.graph.edge_names  # the scores inside a circuit file
    assert [p["k"] for p in again.curve] == sorted(p["k"] for p in again.curve)
    assert again.nodes()[0] in found.graph.senders


def test_graph_figure_layout(circuit):
    _, _, found = circuit
    figure = found.plot()
    graph = found.graph
    assert trace_types([figure]) <= CARTESIAN_TRACES and plotly_bundle(trace_types([figure]))[0] == "cartesian"
    assert len(figure.layout.images) == 1  # the picture under the image-region nodes
    image_box = figure.layout.shapes[0]
    nodes = {name: (x, y) for trace in figure.data if trace.mode and "markers" in trace.mode and trace.hovertext
             for name, x, y in zip(trace.hovertext, trace.x, trace.y, strict=True)}
    for node in graph.inputs[1:]:  # every image node lies on the picture
        x, y = nodes[node.name]
        assert image_box.x0 < x < image_box.x1 and image_box.y0 < y < image_box.y1
    assert nodes["img0[r0,c0]"][0] < nodes["img0[r0,c1]"][0] and nodes["img0[r0,c0]"][1] > nodes["img0[r1,c0]"][1]
    columns = [nodes["L0H0"][0], nodes["MLP0"][0], nodes["L1H0"][0], nodes["MLP1"][0], nodes["logits"][0]]
    assert columns == sorted(columns) and image_box.x1 < columns[0]  # layers left to right
    edge_lines = [t for t in figure.data if t.mode == "lines"]
    widths = sorted({t.line.width for t in edge_lines})
    assert edge_lines and len(widths) >= 2  # width by |score|
    hover = [t for t in figure.data if t.hoverinfo == "text" and t.text]
    assert sum(len(t.text) for t in hover) >= found.n_edges
    page = figure_page(figure)
    assert "<html" in page and "<script src=" not in page  # plotly.js inlined: works offline
    curve = found.plot_curve()
    assert curve.data[0].error_y.array is not None


def test_scores_and_exact_results(circuit, tmp_path):
    model, pairs, found = circuit
    scores = found.scores
    top = scores.top(5)
    assert [abs(v) for _, v in top] == sorted((abs(v) for _, v in top), reverse=True)
    assert set(scores.by_type()) <= {f"{s}->{r}" for s in ("input", "head", "mlp")
                                     for r in ("q", "k", "v", "mlp", "logits")}
    assert sum(len(v) for v in scores.by_type().values()) == scores.graph.n_edges
    again = EdgeScores.load(scores.save(tmp_path / "scores.json"))
    assert torch.allclose(again.per_pair, scores.per_pair) and again.method == "eap-ig" and again.ig_steps == 3
    exact = path_patch(model, pairs, [top[0][0], [top[0][0], top[1][0]]])
    assert exact.conditions[1] == sorted(scores.graph.edge_index(n) for n, _ in top[:2])
    loaded = PathPatchResult.load(exact.save(tmp_path / "exact.json"))
    assert torch.allclose(loaded.effects, exact.effects)
    assert exact.plot().data[0].type == "bar"
    single = path_patch(model, pairs, [n for n, _ in top])
    assert any(t.mode == "lines" for t in single.plot().data)


def test_bad_input_is_one_clear_error(circuit):
    model, pairs, found = circuit
    with pytest.raises(UserInputError, match="applies to method='eap-ig' only"):
        edge_attribution(model, pairs, method="eap", ig_steps=4)
    with pytest.raises(UserInputError, match="method must be one of"):
        edge_attribution(model, pairs, method="acdc")
    with pytest.raises(UserInputError, match="other pairs"):
        extract_circuit(model, make_count_pairs(2, seed=9, size=56), scores=found.scores)
    with pytest.raises(UserInputError, match="not upstream"):
        path_patch(model, pairs, ["MLP1->L0H0.q"])
    with pytest.raises(UserInputError, match="PairBatch"):
        edge_attribution(model, "pairs")
    # mixed image sizes cannot share grid-cell nodes, but whole-image nodes work
    mixed = build_pair_batch(model, [*make_count_pairs(1, seed=1, size=56), *make_count_pairs(1, seed=2, size=84)])
    with pytest.raises(UserInputError, match="different token grids"):
        edge_attribution(model, mixed)
    assert edge_attribution(model, mixed, method="eap", image_nodes="image").graph.n_inputs == 2
    def fails_in_a_patched_run(act, hook):  # the patched runs stack copies of the pairs: more rows
        if act.shape[0] > len(pairs):
            raise RuntimeError("failed inside a patched forward")

    for call in (lambda: path_patch(model, pairs, ["MLP0->logits", "L0H1->L1H2.q"]),
                 lambda: extract_circuit(model, pairs, scores=found.scores, top_k=3)):
        with pytest.raises(RuntimeError, match="failed inside a patched forward"):
            with model.hooks(fwd_hooks=[("blocks.1.hook_mlp_out", fails_in_a_patched_run)]):
                call()
        assert all(not point.fwd_hooks and not point.bwd_hooks for point in model.hook_dict.values())
    with pytest.raises(UserInputError, match="cache_device"):
        path_patch(model, pairs, ["MLP0->logits"], options=SweepOptions(cache_device="cpu"))
    with pytest.raises(UserInputError, match="rank_by"):
        CircuitSettings(rank_by="random")

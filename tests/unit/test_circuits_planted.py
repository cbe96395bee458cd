"""A planted circuit is recovered: image -> L0H1 -> L1H2 -> logits (`tests.helpers.planted_circuit`).

Exact edge patching of every edge finds the planted edges and nothing else of note; EAP and
EAP-IG rank the planted value path first; the extracted circuit is that path, with
faithfulness ~1 measured exactly, and corrupting everything but the planted edges keeps the
clean run's metric.
"""

from __future__ import annotations

import pytest
import torch

from tests.helpers.planted_circuit import PLANTED_EDGES, plant_answers, planted_circuit_model
from vlens.circuits import (
    Condition,
    edge_attribution,
    extract_circuit,
    faithfulness,
    path_patch,
    run_conditions,
)
from vlens.circuits.runs import CircuitMetric
from vlens.data import make_pair
from vlens.patching import build_pair_batch

torch.set_num_threads(1)
VALUE_PATH = ["img0->L0H0-1.v", "L0H1->L1H2-3.v", "L1H2->logits"]


@pytest.fixture(scope="module")
def planted():
    model = planted_circuit_model(seed=1)
    pairs = [make_pair(c, k, seed=10 + i, size=84) for i, (c, k) in enumerate([(1, 2), (3, 4), (5, 6), (7, 8)])]
    batch = build_pair_batch(model, pairs)
    plant_answers(model, batch)
    return model, batch


def test_exact_patching_finds_only_the_planted_edges(planted):
    model, batch = planted
    exact = path_patch(model, batch, "all", image_nodes="image")
    effects, names = exact.edge_effects(), exact.graph.edge_names
    gap = float(exact.corrupt_metric.mean() - exact.clean_metric.mean())
    assert bool((exact.corrupt_metric > exact.clean_metric).all()) and gap > 0.05
    others = torch.tensor([n not in PLANTED_EDGES for n in names])
    assert float(effects[others].abs().max()) < 1e-3 * gap  # only the norms' scales couple the rest
    for name in VALUE_PATH:  # each edge of the value path carries the whole difference
        assert abs(float(effects[names.index(name)]) - gap) < 0.05 * gap, name


@pytest.mark.parametrize("method", ["eap", "eap-ig"])
def test_attribution_ranks_the_planted_path_first_and_the_circuit_is_it(planted, method):
    model, batch = planted
    scores = edge_attribution(model, batch, method=method, image_nodes="image")
    assert {name for name, _ in scores.top(3)} == set(VALUE_PATH)
    assert all(name in PLANTED_EDGES for name, _ in scores.top(5))
    circuit = extract_circuit(model, batch, scores=scores, target=0.95)
    assert set(circuit.edge_names) == set(VALUE_PATH)
    assert abs(circuit.faithfulness - 1) < 0.02
    low, high = circuit.interval
    assert low <= circuit.faithfulness <= high and high - low < 0.1
    sizes = [p["n_edges"] for p in circuit.curve]
    assert sizes == sorted(sizes)  # top-k circuits grow with k
    assert circuit.curve[0]["faithfulness"] < 0.5  # one edge alone does not carry it


def test_everything_but_the_planted_edges_corrupted_keeps_the_clean_metric(planted):
    model, batch = planted
    scores = edge_attribution(model, batch, method="eap", image_nodes="image")
    graph = scores.graph
    values = run_conditions(model, graph, batch, CircuitMetric(batch),
                            [Condition(graph.edge_set(PLANTED_EDGES), invert=True),
                             Condition(graph.edge_set(VALUE_PATH[:2]), invert=True)])
    value = faithfulness(values.patched, values.clean, values.corrupt)
    assert abs(float(value[0]) - 1) < 0.01
    assert abs(float(value[1])) < 0.05  # without L1H2 -> logits the image does not reach the answer

"""Which features an attribution graph attributes when `max_features` leaves some out (docs/graphs.md).

- `partial_influence` equals the exact ``w ((I - N)^-1 - I)`` on a small random graph, whole and partial
  (rows known for some nodes only, as while a graph grows);
- a planted model where feature A matters only through feature B (A -> B -> logit, A's direct effect on the
  logit ~0): circuit-tracer's influence ranking keeps A, direct-effect ranking drops it; the capped graphs'
  edges equal the full graph's and their rows still add up.
"""

from __future__ import annotations

import pytest
import torch

from tests.helpers.models import tiny_vlm
from tests.helpers.transcoders import plant
from vlens.graphs import GraphSettings, ReplacementModel, attribution_graph
from vlens.graphs.pruning import influence, normalize, partial_influence
from vlens.testing import random_image
from vlens.transcoders import TranscoderConfig, Transcoders
from vlens.utils.errors import UserInputError

torch.set_num_threads(1)


def exact_influence(square: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    normalized = normalize(square)
    eye = torch.eye(len(square), dtype=square.dtype)
    return weights @ (torch.linalg.inv(eye - normalized) - eye)


def test_influence_equals_the_exact_inverse_whole_and_partial():
    g = torch.Generator().manual_seed(0)
    n = 9
    # an acyclic graph: node i reads only nodes after it (the target, node 0, reads everything)
    square = torch.randn(n, n, generator=g, dtype=torch.float64).triu(1)
    square[square.abs() < 0.3] = 0
    weights = torch.zeros(n, dtype=torch.float64)
    weights[0] = 1.0
    expected = exact_influence(square, weights)
    assert influence(normalize(square), weights) == pytest.approx(expected.tolist(), abs=1e-12)
    assert partial_influence(square, torch.arange(n), weights) == pytest.approx(expected.tolist(), abs=1e-12)
    # rows known for the target and nodes 3, 5 only: the others pass nothing on
    known = torch.tensor([0, 5, 3])
    partial = torch.zeros_like(square)
    partial[known] = square[known]
    got = partial_influence(square[known], known, weights[known])
    assert got == pytest.approx(exact_influence(partial, weights).tolist(), abs=1e-12)
    assert float(got[8]) > 0 and got.tolist() != expected.tolist()  # a real difference from the whole graph


def indirect_model():
    """Two layers, attention outputs zeroed (only the residual path at each position). Every feature fires
    everywhere with small random weights (noise with small direct effects), except: layer 0's F0 (A) writes
    along a direction the logit difference "5" - "4" does not read; layer 1's F0 (B) reads that direction
    and writes the answer. A's effect on the answer goes through B only."""
    model = tiny_vlm("qwen2_5_vl", seed=3, fresh=True, n_layers=2, d_model=40, n_heads=4, n_kv_heads=2, d_mlp=56)
    d, f = model.cfg.d_model, 8
    with torch.no_grad():
        for block in model.blocks:
            block.attn.o_proj.weight.zero_()
            if block.attn.o_proj.bias is not None:
                block.attn.o_proj.bias.zero_()
    g = torch.Generator().manual_seed(0)
    lm = model.unembed.lm_head.weight.detach()
    reads = model.unembed.apply_norm_weight(lm[5] - lm[4])  # what the logit difference reads from the residual
    reads = reads / reads.norm()
    hidden = torch.randn(d, generator=g)
    hidden -= (hidden @ reads) * reads
    hidden /= hidden.norm()
    tc = Transcoders(TranscoderConfig(kind="plt", activation="relu", layers=(0, 1), d_model=d, d_tc=f))
    for layer in (0, 1):
        e = torch.randn(d, f, generator=g) * 0.05
        b = torch.full((f,), 0.5)
        dec = torch.randn(f, d, generator=g) * 0.05
        if layer == 0:
            b[0], dec[0] = 2.0, 4.0 * hidden  # A
        else:
            e[:, 0], b[0], dec[0] = 0.5 * hidden, 1.0, 2.0 * reads  # B
        plant(model, tc, layer, e, b, dec)
    return model, tc


def test_influence_ranking_keeps_a_feature_that_matters_only_through_another():
    model, tc = indirect_model()
    inputs = model.prepare(images=[[random_image(seed=8)]], prompts=["How many dots are there?"])
    replacement = ReplacementModel(model, tc)
    last = inputs.input_ids.shape[1] - 1
    a, b = f"L0F0@{last}", f"L1F0@{last}"
    full = attribution_graph(replacement, inputs, target=5, contrast=4, settings=GraphSettings(max_features=None))
    target = full.nodes[-1]["name"]
    assert abs(full.edge(target, a)) < 1e-6 < 0.5 < full.edge(target, b)  # A: no direct effect; B: the answer
    assert full.edge(b, a) > 1.0  # A drives B
    noise = sorted((abs(w) for name, w in full.edges_into(target, top=50) if name not in (a, b)), reverse=True)
    assert noise[1] > 1e3 * abs(full.edge(target, a))  # at least two features with more direct effect than A
    capped = {}
    for ranking in ("influence", "direct"):
        settings = GraphSettings(max_features=3, batch_size=1, update_interval=1, ranking=ranking)
        capped[ranking] = graph = attribution_graph(replacement, inputs, target=5, contrast=4, settings=settings)
        assert graph.n_features == 3 and b in graph.names
        assert graph.cost["ranking"] == ranking and graph.cost["backward_passes"] == 4
        assert graph.cost["ranking_updates"] == (3 if ranking == "influence" else 0)
        for name in graph.names[:graph.n_features]:  # the same edges as the full graph, column by column
            assert graph.edge(target, name) == pytest.approx(full.edge(target, name), abs=1e-9)
            assert graph.edge(b, name) == pytest.approx(full.edge(b, name), abs=1e-9)
        for i, value in enumerate(graph.values):
            if value is not None:  # rows still add up, the left-out features in `dropped`
                total = float(graph.adjacency[i].sum()) + graph.biases[i] + graph.dropped[i]
                assert total == pytest.approx(value, abs=1e-5)
    assert a in capped["influence"].names
    assert a not in capped["direct"].names
    # every feature attributed: the ranking no longer matters
    assert torch.equal(attribution_graph(replacement, inputs, target=5, contrast=4, settings=GraphSettings(
        max_features=10**6, ranking="influence")).adjacency, full.adjacency)


def test_bad_ranking_settings_say_what_to_fix():
    with pytest.raises(UserInputError, match="ranking must be one of influence, direct"):
        GraphSettings(ranking="total")
    with pytest.raises(UserInputError, match="update_interval"):
        GraphSettings(update_interval=0)

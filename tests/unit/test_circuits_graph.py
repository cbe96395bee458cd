"""The circuit graph: node and edge names, counts, grouped-query receivers, input positions, pruning."""

from __future__ import annotations

import pytest
import torch

from vlens.circuits.graph import CircuitGraph, image_input_nodes, parse_image_nodes
from vlens.core.inputs import TokenRegions
from vlens.utils.errors import UserInputError


def test_names_and_counts_by_hand():
    graph = CircuitGraph(n_layers=2, n_heads=4, n_kv_heads=2, grids=[(2, 3)], image_nodes="token")
    assert graph.senders[:3] == ["tokens", "img0[r0,c0]", "img0[r0,c1]"]
    assert graph.senders[7:12] == ["L0H0", "L0H1", "L0H2", "L0H3", "MLP0"]
    assert [r.name for r in graph.receivers[:9]] == ["L0H0.q", "L0H1.q", "L0H2.q", "L0H3.q", "L0H0-1.k", "L0H2-3.k",
                                                     "L0H0-1.v", "L0H2-3.v", "MLP0"]
    assert graph.receivers[-1].name == "logits"
    # 7 input nodes; layer 0: 8 attention receivers x 7 + MLP0 x (7 + 4); layer 1: 8 x 12 + (12 + 4); logits 17
    assert graph.n_edges == 8 * 7 + 11 + 8 * 12 + 16 + 17
    assert graph.edge_names[graph.edge("img0[r1,c2]", "L1H2-3.v")] == "img0[r1,c2]->L1H2-3.v"
    assert graph.edge_index("L0H3->MLP0") == graph.edge("L0H3", "MLP0")
    assert graph.edge_types[graph.edge("MLP0", "logits")] == "mlp->logits"
    # every receiver's senders are a prefix of the sender list, its edges contiguous
    for r, receiver in enumerate(graph.receivers):
        lo, hi = int(graph.offsets[r]), int(graph.offsets[r + 1])
        assert graph.edge_sender[lo:hi].tolist() == list(range(receiver.n_senders))


def test_no_gqa_names_blocks_and_whole_images():
    graph = CircuitGraph(1, 3, 3, grids=[(4, 4), (2, 2)], image_nodes=(2, 2))
    assert [r.name for r in graph.receivers[3:6]] == ["L0H0.k", "L0H1.k", "L0H2.k"]
    assert graph.senders[1:5] == ["img0[r0-1,c0-1]", "img0[r0-1,c2-3]", "img0[r2-3,c0-1]", "img0[r2-3,c2-3]"]
    assert graph.senders[5] == "img1[r0,c0]"
    assert [n.name for n in image_input_nodes(0, (5, 5), "image")] == ["img0"]
    assert parse_image_nodes("3x2") == (3, 2)
    with pytest.raises(UserInputError, match="ROWSxCOLS"):
        parse_image_nodes("grid")
    with pytest.raises(UserInputError, match="only a 2x2 token grid"):
        CircuitGraph(1, 2, 2, grids=[(2, 2)], image_nodes=(3, 3))


def test_bad_edges_are_named():
    graph = CircuitGraph(2, 2, 2, grids=[(1, 2)])
    with pytest.raises(UserInputError, match="not upstream"):
        graph.edge_index("L1H0->L0H1.q")
    with pytest.raises(UserInputError, match="no sender 'L9H0'"):
        graph.edge_index("L9H0->logits")
    with pytest.raises(UserInputError, match="sender->receiver"):
        graph.edge_index("L0H0 logits")
    with pytest.raises(UserInputError, match="outside"):
        graph.edge_index(graph.n_edges)


def test_input_masks_follow_the_regions():
    graph = CircuitGraph(1, 2, 2, grids=[(2, 2)], image_nodes=(1, 2))  # two blocks: rows 0-1 x cols 0 / 1
    # row 0: image at 2..5, row 1 (left-padded by one): image at 3..6
    regions = TokenRegions(image=[torch.arange(2, 6), torch.arange(3, 7)],
                           images=[[torch.arange(2, 6)], [torch.arange(3, 7)]],
                           text=[torch.tensor([0, 1, 6, 7]), torch.tensor([1, 2, 7])], final=torch.tensor([7, 7]),
                           image_grid=[[(2, 2)], [(2, 2)]])
    masks = graph.input_masks(regions, seq_len=8)
    assert masks[0, 0].nonzero().flatten().tolist() == [0, 1, 6, 7]
    assert masks[1, 0].nonzero().flatten().tolist() == [2, 4]  # cells (0, 0) and (1, 0)
    assert masks[2, 1].nonzero().flatten().tolist() == [4, 6]
    assert int(masks.sum(0).max()) == 1  # the input nodes partition the positions


def test_prune_keeps_only_complete_paths():
    graph = CircuitGraph(2, 2, 2, grids=[(1, 1)], image_nodes="image")
    keep = torch.zeros(graph.n_edges, dtype=torch.bool)
    path = ["img0->L0H1.v", "L0H1->L1H0.q", "L1H0->logits"]
    dangling = ["img0->L0H0.q", "L1H1->logits", "MLP0->MLP1"]  # L0H0 leads nowhere; L1H1 and MLP0 read nothing
    keep[graph.edge_set(path + dangling)] = True
    kept = graph.prune(keep)
    assert [graph.edge_names[e] for e in kept.nonzero().flatten()] == sorted(path, key=graph.edge_index)


def test_round_trip():
    graph = CircuitGraph(3, 4, 1, grids=[(3, 3)], image_nodes=(3, 1))
    again = CircuitGraph.from_dict(graph.to_dict())
    assert again.edge_names == graph.edge_names and again.senders == graph.senders

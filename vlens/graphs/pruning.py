"""Influence, pruning and the graph scores, as circuit-tracer defines them (docs/graphs.md).

The adjacency matrix ``A [n, n]`` holds direct effects, rows = targets, columns = sources. With
``|A|`` row-normalised (``N = |A| / rowsum``) and the target weights ``w`` (1 on the target node), the
influence of every node on the target is ``w (N + N^2 + ...)`` (the series ends: the graph is acyclic).

- pruning: keep the nodes holding `node_threshold` of the total influence (inputs and the target always),
  then the edges (``N_pruned * (influence + w)`` per edge) holding `edge_threshold` of the edge influence,
  then drop, until nothing changes, feature and error nodes left without an outgoing edge and features
  left without an incoming one;
- replacement score: ``token influence / (token influence + error influence)`` (how much of the target's
  influence reaches it from the inputs, not through error nodes);
- completeness score: ``sum_n (1 - share of n's direct inputs from errors) (influence_n + w_n) / sum_n (influence_n + w_n)``.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from vlens.utils.errors import UserInputError


def normalize(matrix: Float[Tensor, "n n"]) -> Float[Tensor, "n n"]:
    """``|A|`` with every row summing to 1 (rows of zeros stay zero)."""
    absolute = matrix.abs()
    return absolute / absolute.sum(dim=1, keepdim=True).clamp(min=1e-10)


def influence(normalized: Float[Tensor, "n n"], weights: Float[Tensor, " n"], max_iter: int = 10_000) -> Float[Tensor, " n"]:
    """``w N + w N^2 + ...`` (the total influence of each node on the weighted targets)."""
    current = weights @ normalized
    total = current.clone()
    for _ in range(max_iter):
        if not bool(current.any()):
            return total
        current = current @ normalized
        total += current
    raise RuntimeError("influence did not converge: the adjacency matrix has a cycle")


def partial_influence(rows: Float[Tensor, "k n"], row_nodes: Int[Tensor, " k"], weights: Float[Tensor, " k"],
                      max_iter: int = 10_000) -> Float[Tensor, " n"]:
    """The influence of every node on the weighted rows through a graph of which only `rows` are known.

    rows: [k, n], row i the direct effects on node ``row_nodes[i]`` (circuit-tracer's partial edge matrix while
    features are attributed); a node without a row passes nothing on. Equal to `influence` on the square
    matrix holding these rows at ``row_nodes`` and zeros elsewhere (``w ((I - N)^-1 - I)``, `tests/unit/test_graph_ranking.py`).
    """
    normalized = normalize(rows)
    current = weights @ normalized
    total = current.clone()
    for _ in range(max_iter):
        current = current[row_nodes] @ normalized
        if not bool(current.any()):
            return total
        total += current
    raise RuntimeError("influence did not converge: the rows hold a cycle")


def threshold_for(scores: Float[Tensor, " n"], fraction: float) -> Float[Tensor, ""]:
    """The smallest score among the top scores that together hold `fraction` of the total."""
    ordered = torch.sort(scores.flatten(), descending=True).values
    cumulative = torch.cumsum(ordered, 0) / ordered.sum().clamp(min=1e-30)
    index = min(int(torch.searchsorted(cumulative, torch.tensor(fraction, dtype=cumulative.dtype))), len(ordered) - 1)
    return ordered[index]


class Pruned(NamedTuple):
    nodes: Bool[Tensor, " n"]
    edges: Bool[Tensor, "n n"]
    cumulative: Float[Tensor, " n"]  # each node's place in the cumulative influence (0: most influential)


def prune(adjacency: Float[Tensor, "n n"], weights: Float[Tensor, " n"], n_features: int, n_fixed: int,
          node_threshold: float = 0.8, edge_threshold: float = 0.98) -> Pruned:
    """Pruning by influence (module doc). n_fixed: the last nodes (inputs and targets), always kept."""
    for name, value in (("node_threshold", node_threshold), ("edge_threshold", edge_threshold)):
        if not 0.0 <= value <= 1.0:
            raise UserInputError(f"{name} must be in [0, 1], got {value}.")
    node_influence = influence(normalize(adjacency), weights)
    nodes = node_influence >= threshold_for(node_influence, node_threshold)
    nodes[-n_fixed:] = True
    pruned = adjacency.clone()
    pruned[~nodes] = 0
    pruned[:, ~nodes] = 0
    normalized = normalize(pruned)
    edge_scores = normalized * (influence(normalized, weights) + weights)[:, None]
    edges = edge_scores >= threshold_for(edge_scores, edge_threshold)
    edges &= pruned != 0
    previous = None
    while previous is None or not torch.equal(previous, nodes):
        previous = nodes.clone()
        edges[~nodes] = False
        edges[:, ~nodes] = False
        nodes[:-n_fixed] &= edges[:, :-n_fixed].any(0)  # features and errors that reach something
        nodes[:n_features] &= edges[:n_features].any(1)  # features that something reaches
    ordered, order = torch.sort(node_influence, descending=True)
    cumulative = torch.zeros_like(node_influence)
    cumulative[order] = torch.cumsum(ordered, 0) / ordered.sum().clamp(min=1e-30)
    return Pruned(nodes, edges, cumulative)


def graph_scores(adjacency: Float[Tensor, "n n"], weights: Float[Tensor, " n"], errors: slice, tokens: slice
                 ) -> tuple[float, float]:
    """(replacement score, completeness score) of a graph (module doc)."""
    normalized = normalize(adjacency)
    node_influence = influence(normalized, weights)
    token = float(node_influence[tokens].sum())
    error = float(node_influence[errors].sum())
    replacement = token / (token + error) if token + error > 0 else float("nan")
    non_error = 1 - normalized[:, errors].sum(dim=-1)
    output = node_influence + weights
    completeness = float((non_error * output).sum() / output.sum())
    return replacement, completeness

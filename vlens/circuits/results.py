"""Result objects of the circuit methods: edge scores and exact edge-patching effects (save, load, plot)."""

from __future__ import annotations

import base64
import io
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch
from jaxtyping import Float
from PIL import Image
from torch import Tensor

from vlens.circuits.graph import RECEIVER_KINDS, SENDER_KINDS, CircuitGraph
from vlens.patching.pairs import PairAnswers
from vlens.utils.errors import UserInputError
from vlens.utils.finite import json_safe
from vlens.utils.results import Result, read_checked
from vlens.viz.circuit_graph import GraphEdge, GraphNode, circuit_graph_figure
from vlens.viz.optional import require_plotly

MAX_PER_PAIR_NUMBERS = 2_000_000  # per-pair scores beyond this many numbers are left out of results.json


def encode_image(image: Image.Image | None) -> str | None:
    if image is None:
        return None
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def decode_image(text: str | None) -> Image.Image | None:
    if not text:
        return None
    return Image.open(io.BytesIO(base64.b64decode(text))).convert("RGB")


def graph_nodes(graph: CircuitGraph) -> list[GraphNode]:
    """Every node of `graph`, for `circuit_graph_figure`."""
    nodes = []
    for node in graph.inputs:
        if node.part is not None:  # a tile, newlines, a class token: drawn under the picture
            nodes.append(GraphNode(node.name, "image_part", head=node.part, image=node.image))
            continue
        box = None if node.rows is None or node.cols is None else (*node.rows, *node.cols)
        nodes.append(GraphNode(node.name, "tokens" if node.image is None else "image", image=node.image, box=box))
    for layer in range(graph.n_layers):
        nodes += [GraphNode(f"L{layer}H{h}", "head", layer, h) for h in range(graph.n_heads)]
        nodes.append(GraphNode(f"MLP{layer}", "mlp", layer))
    nodes.append(GraphNode("logits", "logits", graph.n_layers))
    return nodes


def graph_edges(graph: CircuitGraph, indices: Sequence[int], scores: Tensor) -> list[GraphEdge]:
    """The edges `indices` with their `scores` ([n_edges]), for `circuit_graph_figure`."""
    out = []
    for e in indices:
        receiver = graph.receivers[int(graph.edge_receiver[e])]
        if receiver.kind not in ("mlp", "logits"):
            targets = tuple(f"L{receiver.layer}H{h}" for h in receiver.heads)
        else:
            targets = (receiver.name,)
        out.append(GraphEdge(graph.edge_names[e], graph.senders[int(graph.edge_sender[e])], targets, receiver.kind,
                             float(scores[e])))
    return out


def edges_figure(graph: CircuitGraph, indices: Sequence[int], scores: Tensor, thumbnail: Image.Image | None,
                 title: str, value_label: str):
    return circuit_graph_figure(graph_nodes(graph), graph_edges(graph, indices, scores), graph.n_layers,
                                graph.n_heads, graph.grids, thumbnail, title=title, value_label=value_label)


def ranked(scores: Tensor, by: str = "abs") -> Tensor:
    """Edge indices from the most to the least important: by |score| ("abs") or by score ("signed")."""
    if by not in ("abs", "signed"):
        raise UserInputError(f"rank_by {by!r}: use 'abs' or 'signed'")
    key = scores.abs() if by == "abs" else scores
    return key.nan_to_num(float("-inf")).argsort(descending=True, stable=True)


def _per_pair_json(per_pair: Tensor) -> list | None:
    return per_pair.tolist() if per_pair.numel() <= MAX_PER_PAIR_NUMBERS else None


@dataclass
class EdgeScores(Result):
    """EAP / EAP-IG scores of every edge of `graph`.

    scores: [n_edges] mean over pairs of the estimated change of the metric (patched minus
    clean) when only that edge is corrupted; per_pair: [n_pairs, n_edges]; clean_metric /
    corrupt_metric: [n_pairs] the unpatched runs' metric; method "eap" / "eap-ig" (ig_steps).
    """

    graph: CircuitGraph
    scores: Float[Tensor, " n_edges"]
    per_pair: Float[Tensor, "n_pairs n_edges"] | None
    method: str
    ig_steps: int
    metric: str
    clean_metric: Float[Tensor, " n_pairs"]
    corrupt_metric: Float[Tensor, " n_pairs"]
    pair_ids: list[str]
    thumbnail: Image.Image | None = None
    answers: PairAnswers | None = None

    kind: ClassVar[str] = "edge_scores"
    saved_dims: ClassVar[dict[str, str]] = {"pair_ids": "n_pairs"}  # checked when a file is read

    @property
    def edge_names(self) -> list[str]:
        return self.graph.edge_names

    def score(self, edge: str | int | tuple[str, str]) -> float:
        """The score of one edge ("L0H1->MLP2", (sender, receiver) or an index)."""
        return float(self.scores[self.graph.edge_index(edge)])

    def top(self, k: int = 20, by: str = "abs") -> list[tuple[str, float]]:
        """The `k` highest-ranked edges as (name, score)."""
        return [(self.graph.edge_names[int(e)], float(self.scores[e])) for e in ranked(self.scores, by)[:k]]

    def by_type(self) -> dict[str, Tensor]:
        """Edge indices per type "sender kind->receiver kind" (input/head/mlp -> q/k/v/mlp/logits)."""
        groups: dict[str, list[int]] = {}
        for e, kind in enumerate(self.graph.edge_types):
            groups.setdefault(kind, []).append(e)
        order = [f"{s}->{r}" for s in SENDER_KINDS for r in RECEIVER_KINDS]
        return {kind: torch.tensor(groups[kind]) for kind in order if kind in groups}

    def to_dict(self) -> dict:
        per_pair = None if self.per_pair is None else _per_pair_json(self.per_pair)
        return json_safe({
            "kind": self.kind, "method": self.method, "ig_steps": self.ig_steps, "metric": self.metric,
            "estimates": "change of the mean metric when only this edge is corrupted (patched minus clean), "
                         "first order (EAP) or integrated along corrupt -> clean inputs (EAP-IG)",
            "graph": self.graph.to_dict(), "n_pairs": len(self.pair_ids), "pair_ids": list(self.pair_ids),
            "edges": self.graph.edge_names, "scores": self.scores.tolist(), "per_pair": per_pair,
            "clean_metric": self.clean_metric.tolist(), "corrupt_metric": self.corrupt_metric.tolist(),
            "thumbnail_png": encode_image(self.thumbnail),
            **({"answers": self.answers} if self.answers is not None else {}),
        })

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EdgeScores:
        graph = CircuitGraph.from_dict(data["graph"])
        scores = torch.tensor([float("nan") if v is None else v for v in data["scores"]])
        if scores.numel() != graph.n_edges:
            raise UserInputError(f"the field 'scores' holds {scores.numel()} scores for a graph of {graph.n_edges} edges")
        per_pair = None if data.get("per_pair") is None else torch.tensor(
            [[float("nan") if v is None else v for v in row] for row in data["per_pair"]])
        return cls(graph=graph, scores=scores, per_pair=per_pair, method=data["method"], ig_steps=int(data["ig_steps"]),
                   metric=data["metric"], clean_metric=_floats(data["clean_metric"]),
                   corrupt_metric=_floats(data["corrupt_metric"]), pair_ids=list(data["pair_ids"]),
                   thumbnail=decode_image(data.get("thumbnail_png")), answers=data.get("answers"))

    @classmethod
    def load(cls, path: str | Path) -> EdgeScores:
        """Read what `save` wrote (the JSON file, or a folder holding results.json); a saved circuit
        gives the scores it was ranked by."""
        path = Path(path)
        data = cls.read_saved(path)
        if data.get("kind") == "circuit":
            data = data["scores"]
        # checked as load_result checks it (a field of another type or size is a UserInputError naming it)
        return read_checked(cls, data, path / cls.filename if path.is_dir() else path)

    def plot(self, k: int = 40, by: str = "abs"):
        """The graph with the `k` highest-ranked edges, width by |score|."""
        indices = ranked(self.scores, by)[:k].tolist()
        label = self.method.upper()
        return edges_figure(self.graph, indices, self.scores, self.thumbnail,
                            f"{label} scores: top {len(indices)} of {self.graph.n_edges} edges ({self.metric})",
                            f"{label} score")


def _floats(values: Sequence) -> Tensor:
    return torch.tensor([float("nan") if v is None else float(v) for v in values])


@dataclass
class PathPatchResult(Result):
    """Exact effects of corrupting edge sets: `effects` [n_conditions] = mean over pairs of the
    metric with those edges corrupted minus the clean run's; `patched` [n_conditions, n_pairs]
    the metric itself; `conditions` the edge indices of each set."""

    graph: CircuitGraph
    conditions: list[list[int]]
    patched: Float[Tensor, "n_conditions n_pairs"]
    clean_metric: Float[Tensor, " n_pairs"]
    corrupt_metric: Float[Tensor, " n_pairs"]
    metric: str
    pair_ids: list[str]
    thumbnail: Image.Image | None = None

    kind: ClassVar[str] = "path_patching"
    saved_dims: ClassVar[dict[str, str]] = {"conditions": "n_conditions", "pair_ids": "n_pairs"}  # read checks

    @property
    def effects(self) -> Float[Tensor, " n_conditions"]:
        return self.patched.mean(1) - self.clean_metric.mean()

    @property
    def per_pair_effects(self) -> Float[Tensor, "n_conditions n_pairs"]:
        return self.patched - self.clean_metric[None]

    def edge_effects(self) -> Float[Tensor, " n_edges"]:
        """[n_edges] the effect of each single-edge condition at its edge (NaN for edges not patched alone)."""
        out = torch.full((self.graph.n_edges,), float("nan"))
        for i, edges in enumerate(self.conditions):
            if len(edges) == 1:
                out[edges[0]] = self.effects[i]
        return out

    def to_dict(self) -> dict:
        names = self.graph.edge_names
        return json_safe({
            "kind": self.kind, "metric": self.metric, "graph": self.graph.to_dict(),
            "effects": "mean over pairs of the metric with the condition's edges corrupted minus the clean run's",
            "conditions": [[names[e] for e in edges] for edges in self.conditions],
            "effect": self.effects.tolist(), "patched": self.patched.tolist(),
            "clean_metric": self.clean_metric.tolist(), "corrupt_metric": self.corrupt_metric.tolist(),
            "pair_ids": list(self.pair_ids), "thumbnail_png": encode_image(self.thumbnail),
        })

    @classmethod
    def from_dict(cls, data: dict) -> PathPatchResult:
        graph = CircuitGraph.from_dict(data["graph"])
        return cls(graph=graph, conditions=[[graph.edge_index(e) for e in edges] for edges in data["conditions"]],
                   patched=torch.tensor([[float("nan") if v is None else v for v in row] for row in data["patched"]]),
                   clean_metric=_floats(data["clean_metric"]), corrupt_metric=_floats(data["corrupt_metric"]),
                   metric=data["metric"], pair_ids=list(data["pair_ids"]),
                   thumbnail=decode_image(data.get("thumbnail_png")))

    def plot(self, k: int = 40):
        """Single-edge conditions: the graph with the `k` largest exact effects; otherwise a bar chart."""
        if self.conditions and all(len(c) == 1 for c in self.conditions):
            effects = self.edge_effects()
            indices = ranked(effects.nan_to_num(0.0))[:k].tolist()
            return edges_figure(self.graph, indices, effects.nan_to_num(0.0), self.thumbnail,
                                f"exact edge patching: top {len(indices)} effects ({self.metric})", "exact effect")
        go = require_plotly()
        names = self.graph.edge_names
        labels = [names[c[0]] if len(c) == 1 else f"{len(c)} edges" for c in self.conditions]
        figure = go.Figure(go.Bar(x=labels, y=self.effects.tolist()))
        return figure.update_layout(title=f"exact edge patching ({self.metric})", yaxis_title="effect")

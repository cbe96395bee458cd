"""An attribution graph as a result: nodes, the adjacency matrix, pruning, scores, files (docs/graphs.md).

Nodes, in circuit-tracer's order: active transcoder features ``L{l}F{i}@{pos}``, error nodes
``err{l}@{pos}`` (every decoder layer x position), input nodes (text tokens ``tok{pos}``, image tokens
grouped as ``img0[r2,c3]`` / ``img0[r0-1,c2-3]`` / ``img0.tile[r0,c1]``), then the target node
(``logit["5"]``, or ``logit["5"-"4"]`` for a logit difference). ``adjacency[t, s]`` is the direct effect
of node s on node t in the linearised replacement model (rows of features: on the feature's
pre-activation; the target row: on the logit or logit difference). Per target row, ``values`` is what
the row explains (the pre-activation, the logit) and ``biases`` the part no node carries (encoder
bias, decoder biases, attention output biases, the unembedding bias), so each row sums exactly:
``sum_s adjacency[t, s] + biases[t] == values[t]``.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal, TypedDict, cast

import torch
from jaxtyping import Float
from torch import Tensor

from vlens.graphs.files import circuit_tracer_json, write_viewer
from vlens.graphs.pruning import Pruned, graph_scores, prune
from vlens.utils.errors import UserInputError
from vlens.utils.results import Result


class _NodeKeys(TypedDict):
    name: str
    kind: Literal["feature", "error", "token", "image", "logit"]
    layer: int | None  # (None: an input node)
    pos: int
    feature: int | None  # a feature's index; the logit node's token id
    activation: float | None
    label: str


class GraphNode(_NodeKeys, total=False):
    """One node of an attribution graph, as results.json records it (checked when a file is read)."""

    positions: list[int]  # input nodes: every position the group covers
    token_id: int  # input nodes
    image: int  # image nodes: which image
    contrast: int | None  # the logit node: the contrast token's id


class GraphTarget(TypedDict):
    """What the graph explains: the target token (and its contrast for a logit difference) and its value."""

    token: str
    token_id: int
    contrast: str | None
    contrast_id: int | None
    value: float


@dataclass
class AttributionGraph(Result):
    """The graph of one prompt and target (module doc).

    nodes: one dict per node: name, kind ("feature" | "error" | "token" | "image" | "logit"), layer, pos
        (an input group: its first position), feature, activation, label, positions (input nodes).
    adjacency: [n_nodes, n_nodes], rows = targets, columns = sources.
    values / biases: per node (None where a node has no incoming edges: errors and inputs). dropped: per row, the
        summed direct effect of active features left out by `max_features` (0 when every one is a node), so
        ``sum(row) + bias + dropped == value``.
    target: token, token_id, contrast, contrast_id, value. prompt_tokens: the prompt's tokens (labels).
    feature_maps: "L{l}F{i}" -> that feature's activation at every position of the prompt (the viewer's
        top patches and tokens). images: per image: width, height and a PNG data URL; boxes: input node
        name -> [image, x0, y0, x1, y1] in the image's pixels.
    cost: forward passes, backward passes, rows and forward-equivalents (docs/graphs.md).
    settings: batch_size, image_nodes, max_features, node_threshold, edge_threshold; model: its name.
    supernodes: user-named groups of nodes {name: [node names]}.
    examples: the features' top image patches and text tokens over a dataset (`vlens.graphs.examples`:
        n_prompts, top_k, features {"L{l}F{i}": {"image": hits, "text": hits}}); empty until attached.
    """

    nodes: list[GraphNode]
    adjacency: Float[Tensor, "n_nodes n_nodes"]
    values: list[float | None]
    biases: list[float | None]
    target: GraphTarget
    dropped: list[float | None] = field(default_factory=list)
    prompt_tokens: list[str] = field(default_factory=list)
    feature_maps: dict[str, list[float]] = field(default_factory=dict)
    images: list[dict[str, Any]] = field(default_factory=list)
    boxes: dict[str, list[float]] = field(default_factory=dict)
    cost: dict[str, Any] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)
    model: str = ""
    n_layers: int = 0
    supernodes: dict[str, list[str]] = field(default_factory=dict)
    examples: dict[str, Any] = field(default_factory=dict)

    kind: ClassVar[str] = "attribution_graph"
    # checked when a file is read (`dropped`, the tokens and the maps are empty in files of older versions: not sized)
    saved_dims: ClassVar[dict[str, str]] = {"nodes": "n_nodes", "values": "n_nodes", "biases": "n_nodes",
                                            "dropped": "n_nodes", "prompt_tokens": "n_positions",
                                            "feature_maps[*]": "n_positions"}

    # ------------------------------------------------------------------ structure
    @property
    def names(self) -> list[str]:
        return [node["name"] for node in self.nodes]

    def index(self, name: str) -> int:
        for i, node in enumerate(self.nodes):
            if node["name"] == name:
                return i
        raise UserInputError(f"no node {name!r} in this graph (nodes look like L2F17@5, err1@3, tok4, img0[r1,c2], "
                             f"{self.nodes[-1]['name']}).")

    def count(self, kind: str) -> int:
        return sum(node["kind"] == kind for node in self.nodes)

    @property
    def n_features(self) -> int:
        return self.count("feature")

    @property
    def errors(self) -> slice:
        return slice(self.n_features, self.n_features + self.count("error"))

    @property
    def inputs(self) -> slice:
        return slice(self.errors.stop, self.errors.stop + self.count("token") + self.count("image"))

    @property
    def weights(self) -> Tensor:
        """The target weights (1 on the target node)."""
        w = torch.zeros(len(self.nodes), dtype=self.adjacency.dtype)
        w[-1] = 1.0
        return w

    def edge(self, target: str, source: str) -> float:
        """The direct effect of node `source` on node `target`."""
        return float(self.adjacency[self.index(target), self.index(source)])

    def edges_into(self, name: str, top: int = 10) -> list[tuple[str, float]]:
        """The `top` sources of node `name` by |direct effect|."""
        row = self.adjacency[self.index(name)]
        order = torch.argsort(row.abs(), descending=True)[:top]
        return [(self.nodes[i]["name"], float(row[i])) for i in order.tolist() if float(row[i]) != 0]

    # ------------------------------------------------------------------ pruning and scores
    def prune(self, node_threshold: float | None = None, edge_threshold: float | None = None) -> Pruned:
        """Node and edge masks after pruning by influence (`vlens.graphs.pruning.prune`)."""
        nt = self.settings.get("node_threshold", 0.8) if node_threshold is None else node_threshold
        et = self.settings.get("edge_threshold", 0.98) if edge_threshold is None else edge_threshold
        return prune(self.adjacency, self.weights, self.n_features, len(self.nodes) - self.inputs.start, nt, et)

    def scores(self) -> dict[str, float]:
        """circuit-tracer's replacement and completeness scores of the whole graph and of the pruned one."""
        replacement, completeness = graph_scores(self.adjacency, self.weights, self.errors, self.inputs)
        pruned = self.prune()
        keep = pruned.edges & pruned.nodes[:, None] & pruned.nodes[None, :]
        p_replacement, p_completeness = graph_scores(self.adjacency * keep, self.weights, self.errors, self.inputs)
        return {"replacement": replacement, "completeness": completeness, "pruned_replacement": p_replacement,
                "pruned_completeness": p_completeness, "pruned_nodes": int(pruned.nodes.sum()),
                "pruned_edges": int(keep.sum())}

    def supernode(self, name: str, members: list[str]) -> None:
        """Name a group of nodes (kept in the files; circuit-tracer's frontend shows it as a supernode)."""
        for member in members:
            self.index(member)
        if not members:
            raise UserInputError(f"supernode {name!r} needs at least one node.")
        self.supernodes[name] = list(members)

    # ------------------------------------------------------------------ files
    def to_dict(self) -> dict:
        rows, cols = self.adjacency.nonzero(as_tuple=True)
        return {"kind": "attribution_graph", "model": self.model, "n_layers": self.n_layers, "target": self.target,
                "nodes": self.nodes, "values": self.values, "biases": self.biases, "dropped": self.dropped,
                "n_nodes": len(self.nodes), "n_edges": len(rows),
                "edges": [[int(r), int(c), float(self.adjacency[r, c])] for r, c in zip(rows.tolist(), cols.tolist(),
                                                                                       strict=True)],
                "prompt_tokens": self.prompt_tokens, "feature_maps": self.feature_maps, "images": self.images,
                "boxes": self.boxes, "cost": self.cost, "settings": self.settings, "supernodes": self.supernodes,
                "examples": self.examples, "scores": self.scores()}

    @classmethod
    def from_dict(cls, data: dict) -> AttributionGraph:
        n = int(data["n_nodes"])
        edges, n_edges = data.get("edges", []), data.get("n_edges")  # (files before n_edges was written: not checked)
        if isinstance(n_edges, int) and isinstance(edges, list) and len(edges) != n_edges:
            raise UserInputError(f"the field 'edges' holds {len(edges)} edges, but 'n_edges' says {n_edges}: an "
                                 "entry was removed or added (the file was edited or cut short)")
        adjacency = torch.zeros(n, n, dtype=torch.float64)
        for row, col, weight in data.get("edges", []):
            adjacency[row, col] = weight
        return cls(nodes=list(data["nodes"]), adjacency=adjacency, values=list(data["values"]),
                   biases=list(data["biases"]), target=cast(GraphTarget, dict(data["target"])), dropped=list(data.get("dropped", [])), prompt_tokens=list(data["prompt_tokens"]),
                   feature_maps=dict(data.get("feature_maps", {})), images=list(data.get("images", [])),
                   boxes=dict(data.get("boxes", {})), cost=dict(data.get("cost", {})),
                   settings=dict(data.get("settings", {})), model=str(data.get("model", "")),
                   n_layers=int(data.get("n_layers", 0)), supernodes=dict(data.get("supernodes", {})),
                   examples=dict(data.get("examples", {})))

    def save(self, path: str | os.PathLike) -> Path:
        """Write results.json (loads back with `vlens.load_result`), graph.json (circuit-tracer's schema, with
        graph-metadata.json beside it for its frontend) and graph.html (vlens's offline viewer) in folder `path`."""
        folder = Path(path)
        written = super().save(folder)
        slug = str(self.settings.get("slug") or "graph")
        payload = circuit_tracer_json(self, slug)
        (folder / "graph.json").write_text(json.dumps(payload, indent=1) + "\n", encoding="utf-8")
        (folder / "graph-metadata.json").write_text(json.dumps({"graphs": [payload["metadata"]]}, indent=1) + "\n",
                                                    encoding="utf-8")
        write_viewer(self, folder / "graph.html")
        return written

    def plot(self, *args: Any, **kwargs: Any) -> Any:
        """A bar chart of the target's largest direct effects (the full graph: graph.html)."""
        import plotly.graph_objects as go

        top = self.edges_into(self.nodes[-1]["name"], top=20)
        figure = go.Figure(go.Bar(x=[w for _, w in top], y=[name for name, _ in top], orientation="h"))
        return figure.update_layout(title=f"direct effects on {self.nodes[-1]['name']}", yaxis={"autorange": "reversed"})

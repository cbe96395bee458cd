"""Circuits: the smallest set of top-scored edges that reaches a faithfulness, measured exactly.

A circuit C is run by corrupting every edge *not* in C (`vlens.circuits.path_patching`): the
receivers read the corrupt senders' outputs except along C's edges. Its faithfulness is

    F(C) = (mean M(C) - mean M(corrupt)) / (mean M(clean) - mean M(corrupt))

over the pairs (1: the circuit alone gives the full model's metric; 0: as if everything were
corrupt; the empty circuit is the corrupt run and the full graph the clean run, exactly).

`extract_circuit` ranks the edges by a score (|EAP-IG| by default), takes the top k, keeps the
edges that lie on a path from an input node to the logits within the set (the others cannot
change the run), and measures F exactly for k on a doubling grid (1, 2, 4, ... and every edge).
With a `target` it then narrows down the smallest k whose circuit reaches the target between
the last grid point below it and the first one at or above it, evaluating up to `refine`
evenly spaced k per round (this assumes F rises with k inside that bracket; the measured
curve is kept so a reader can see where it does not). 95% bootstrap intervals of F resample
the pairs (the ratio of resampled means).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, TypedDict, cast

import torch
from jaxtyping import Float
from PIL import Image
from torch import Tensor

from vlens.circuits.attribution import edge_attribution
from vlens.circuits.graph import CircuitGraph, ImageNodes, require_sequential_blocks
from vlens.circuits.path_patching import Condition, run_conditions
from vlens.circuits.results import EdgeScores, edges_figure, ranked
from vlens.circuits.runs import CircuitMetric, circuit_options, pair_batch
from vlens.parallel.options import SweepOptions
from vlens.patching.metrics import MetricFn
from vlens.utils.errors import UserInputError
from vlens.utils.finite import json_safe
from vlens.utils.noise_floor import GapFloor, floored_ratio, gap_floor
from vlens.utils.results import Result
from vlens.utils.validation import check_count, check_float
from vlens.viz.optional import require_plotly

if TYPE_CHECKING:
    from vlens.core.model import HookedVLM


LEVEL = 0.95


def faithfulness_floor(clean: Tensor, corrupt: Tensor) -> GapFloor:
    """The noise floor of F's denominator mean M(clean) - mean M(corrupt) (`vlens.utils.noise_floor`): its
    standard error over the pairs, and the resolution of the metric's values at their magnitude."""
    values = torch.cat([clean.flatten(), corrupt.flatten()]).double()
    values = values[values.isfinite()]
    magnitude = float(values.abs().mean()) if values.numel() else 0.0
    dtype = clean.dtype if clean.dtype in (torch.float16, torch.bfloat16) else torch.float32
    return gap_floor(clean.double() - corrupt.double(), magnitude=magnitude, dtype=dtype)


def faithfulness(patched: Tensor, clean: Tensor, corrupt: Tensor) -> Tensor:
    """F per condition from per-pair metric values: patched [n_conditions, n_pairs], clean / corrupt [n_pairs].

    NaN, with a `NoiseFloorWarning`, when the clean and corrupt means differ by no more than their noise
    floor (`faithfulness_floor`): F would then be a ratio of noise (2.26 with an interval of [-4.9, 10.1])."""
    clean_mean, corrupt_mean = clean.double().mean(), corrupt.double().mean()
    floor = faithfulness_floor(clean, corrupt)
    scale = floored_ratio(1.0, floor, "mean clean minus corrupt metric", "the circuit's faithfulness")
    if not floor.defined or not torch.isfinite(clean_mean - corrupt_mean):
        return torch.full(patched.shape[:1], float("nan"), dtype=torch.float64)
    return (patched.double().mean(-1) - corrupt_mean) * scale


def faithfulness_interval(patched: Tensor, clean: Tensor, corrupt: Tensor, n_resamples: int = 1000,
                          seed: int = 0, level: float = LEVEL) -> tuple[Tensor, Tensor]:
    """Percentile bootstrap interval over pairs of the faithfulness F of each condition (the ratio of
    resampled means; a resample whose denominator is within the full sample's noise floor counts as
    undefined, and every bound is NaN when the full sample's is: `faithfulness`).

    Args:
        patched: [n_conditions, n_pairs] the metric with each condition's edges clean, the rest corrupted.
        clean, corrupt: [n_pairs] the metric of the clean and of the corrupt run.
        n_resamples, seed, level: the bootstrap's resamples of the pairs, its seed, the interval's level.
    Returns:
        (low, high), each [n_conditions].
    """
    floor = faithfulness_floor(clean, corrupt)
    if not floor.defined:
        missing = torch.full(patched.shape[:1], float("nan"), dtype=torch.float64)
        return missing, missing.clone()
    n = clean.shape[0]
    generator = torch.Generator().manual_seed(seed)
    index = torch.randint(0, n, (n_resamples, n), generator=generator)
    clean_b, corrupt_b = clean.double()[index].mean(-1), corrupt.double()[index].mean(-1)  # [R]
    patched_b = patched.double()[:, index].mean(-1)  # [C, R]
    values = (patched_b - corrupt_b) / (clean_b - corrupt_b)
    values = values.masked_fill((clean_b - corrupt_b).abs() <= floor.floor, float("nan"))
    tail = (1 - level) / 2
    quantiles = torch.tensor([tail, 1 - tail], dtype=torch.float64)
    low, high = torch.nanquantile(values, quantiles, dim=1)
    return low, high


def doubling_grid(n_edges: int) -> list[int]:
    """1, 2, 4, ... below n_edges, and n_edges."""
    grid, k = [], 1
    while k < n_edges:
        grid.append(k)
        k *= 2
    return [*grid, n_edges]


class CurvePoint(TypedDict):
    """One measured point of a circuit's faithfulness curve (checked when a file is read)."""

    k: int
    n_edges: int
    faithfulness: float  # (JSON null: NaN, a denominator within its noise floor)
    low: float
    high: float


def _check_edge_count(data: dict) -> None:
    """A circuit file's `edges` against the `n_edges` and `edge_scores` written from them: the list that disagrees
    with the other two is named (an entry removed), not the fields derived from it."""
    edges, n_edges, written = data.get("edges"), data.get("n_edges"), data.get("edge_scores")
    if not (isinstance(edges, list) and isinstance(n_edges, int)) or len(edges) == n_edges:
        return
    if isinstance(written, list) and len(written) == len(edges):
        raise UserInputError(f"the field 'n_edges' is {n_edges}, but 'edges' and 'edge_scores' hold {len(edges)}")
    raise UserInputError(f"the field 'edges' holds {len(edges)} edges, but 'n_edges' says {n_edges}: an entry was "
                         "removed or added (the file was edited or cut short)")


@dataclass
class Circuit(Result):
    """An extracted circuit, its faithfulness curve and the scores it was ranked by.

    edges: the circuit's edge indices (after pruning to input-to-logits paths); k: how many
    top-ranked edges were taken; faithfulness with its 95% bootstrap interval (low, high);
    curve: every measured point {k, n_edges, faithfulness, low, high}; per_pair_metric: [n_pairs]
    the metric with only the circuit's edges clean; clean_metric / corrupt_metric: [n_pairs].
    """

    scores: EdgeScores
    edges: list[int]
    k: int
    faithfulness: float
    interval: tuple[float, float]
    target: float | None
    curve: list[CurvePoint]
    per_pair_metric: Float[Tensor, " n_pairs"]
    clean_metric: Float[Tensor, " n_pairs"]
    corrupt_metric: Float[Tensor, " n_pairs"]
    rank_by: str = "abs"
    pruned: bool = True
    extra: dict = field(default_factory=dict)

    kind: ClassVar[str] = "circuit"

    @property
    def graph(self) -> CircuitGraph:
        return self.scores.graph

    @property
    def edge_names(self) -> list[str]:
        return [self.graph.edge_names[e] for e in self.edges]

    @property
    def n_edges(self) -> int:
        return len(self.edges)

    @property
    def thumbnail(self) -> Image.Image | None:
        return self.scores.thumbnail

    def nodes(self) -> list[str]:
        """The senders and receivers the circuit's edges join."""
        graph, names = self.graph, []
        for e in self.edges:
            for name in (graph.senders[int(graph.edge_sender[e])], graph.receivers[int(graph.edge_receiver[e])].name):
                if name not in names:
                    names.append(name)
        return names

    def to_dict(self) -> dict:
        return json_safe({
            "kind": self.kind,
            "definition": "faithfulness = (mean M(circuit) - mean M(corrupt)) / (mean M(clean) - mean M(corrupt)); "
                          "M(circuit): the metric with every edge outside the circuit corrupted (exact edge patching)",
            "metric": self.scores.metric, "method": self.scores.method, "ig_steps": self.scores.ig_steps,
            "rank_by": self.rank_by, "pruned": self.pruned, "target": self.target, "k": self.k,
            "n_edges": self.n_edges, "n_graph_edges": self.graph.n_edges, "faithfulness": self.faithfulness,
            "faithfulness_interval": {"level": LEVEL, "method": "percentile bootstrap over pairs",
                                      "low": self.interval[0], "high": self.interval[1]},
            "faithfulness_floor": faithfulness_floor(self.clean_metric, self.corrupt_metric).to_dict(),
            "edges": self.edge_names, "edge_scores": [float(self.scores.scores[e]) for e in self.edges],
            "nodes": self.nodes(), "curve": self.curve,
            "per_pair_metric": self.per_pair_metric.tolist(),
            "clean_metric_mean": float(self.clean_metric.mean()), "corrupt_metric_mean": float(self.corrupt_metric.mean()),
            "clean_metric": self.clean_metric.tolist(), "corrupt_metric": self.corrupt_metric.tolist(),
            **self.extra,
            "scores": self.scores.to_dict(),
        })

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Circuit:
        if data.get("kind", cls.kind) != cls.kind:
            raise UserInputError(f"not a circuit result (kind {data.get('kind')!r}): read it with vlens.load_result")
        scores = EdgeScores.from_dict(data["scores"])
        _check_edge_count(data)
        interval = data["faithfulness_interval"]
        known = {"kind", "definition", "metric", "method", "ig_steps", "rank_by", "pruned", "target", "k", "n_edges",
                 "n_graph_edges", "faithfulness", "faithfulness_interval", "faithfulness_floor", "edges", "edge_scores", "nodes", "curve",
                 "per_pair_metric", "clean_metric_mean", "corrupt_metric_mean", "clean_metric", "corrupt_metric",
                 "scores"}

        def floats(values) -> Tensor:
            return torch.tensor([float("nan") if v is None else float(v) for v in values])

        return cls(scores=scores, edges=[scores.graph.edge_index(e) for e in data["edges"]], k=int(data["k"]),
                   faithfulness=float("nan") if data["faithfulness"] is None else float(data["faithfulness"]),
                   interval=(_nan(interval["low"]), _nan(interval["high"])), target=data.get("target"),
                   curve=list(data["curve"]), per_pair_metric=floats(data["per_pair_metric"]),
                   clean_metric=floats(data["clean_metric"]), corrupt_metric=floats(data["corrupt_metric"]),
                   rank_by=data.get("rank_by", "abs"), pruned=bool(data.get("pruned", True)),
                   extra={k: v for k, v in data.items() if k not in known})

    def plot(self, max_edges: int | None = 60):
        """The circuit's graph: its edges (the `max_edges` of largest |score|; None: all), width by
        |score|, image regions on the picture."""
        shown = sorted(self.edges, key=lambda e: -abs(float(self.scores.scores[e])))
        if max_edges is not None:
            shown = shown[:max_edges]
        part = "" if len(shown) == self.n_edges else f" (the {len(shown)} of largest |score| drawn)"
        title = (f"circuit: {self.n_edges} of {self.graph.n_edges} edges{part}, faithfulness {self.faithfulness:.2f} "
                 f"[{self.interval[0]:.2f}, {self.interval[1]:.2f}] ({self.scores.method.upper()}, {self.scores.metric})")
        return edges_figure(self.graph, shown, self.scores.scores, self.thumbnail, title,
                            f"{self.scores.method.upper()} score")

    def plot_curve(self):
        """Faithfulness against the circuit's size (edges after pruning), with 95% bootstrap intervals."""
        go = require_plotly()
        points = sorted(self.curve, key=lambda p: p["n_edges"])
        x = [p["n_edges"] for p in points]
        y = [p["faithfulness"] for p in points]
        upper = [None if p["high"] is None or p["faithfulness"] is None else p["high"] - p["faithfulness"]
                 for p in points]
        lower = [None if p["low"] is None or p["faithfulness"] is None else p["faithfulness"] - p["low"]
                 for p in points]
        figure = go.Figure(go.Scatter(x=x, y=y, mode="lines+markers", name="faithfulness",
                                      error_y={"type": "data", "array": upper, "arrayminus": lower},
                                      text=[f"top {p['k']} edges" for p in points],
                                      hovertemplate="%{text}: %{x} edges<br>faithfulness %{y:.3f}<extra></extra>"))
        if self.target is not None:
            figure.add_hline(y=self.target, line_dash="dash", annotation_text=f"target {self.target:g}")
        figure.add_vline(x=max(self.n_edges, 1), line_dash="dot", annotation_text=f"circuit: {self.n_edges} edges")
        return figure.update_layout(title="circuit faithfulness (exact) against size", xaxis_type="log",
                                    xaxis_title="edges in the circuit", yaxis_title="faithfulness")


def _nan(value) -> float:
    return float("nan") if value is None else float(value)


def circuit_edges(graph: CircuitGraph, order: Tensor, k: int, prune: bool) -> Tensor:
    """Indices of the top-k edges of `order` (pruned to input-to-logits paths)."""
    keep = torch.zeros(graph.n_edges, dtype=torch.bool)
    keep[order[:k]] = True
    if prune:
        keep = graph.prune(keep)
    return keep.nonzero().flatten()


@dataclass(frozen=True)
class CircuitSettings:
    """How `extract_circuit` finds a circuit (what it measures; how it runs is `vlens.SweepOptions`).

    method / ig_steps / image_nodes: the edge scores computed when none are given
        (`edge_attribution`); rank_by: "abs" (|score|, default) or "signed" (largest positive
        first); prune: keep only edges on input-to-logits paths within the set (they alone change
        the run); refine: k values evaluated per refinement round; n_resamples / seed: the
        bootstrap of the faithfulness intervals.
    """

    method: str = "eap-ig"
    ig_steps: int | None = None
    image_nodes: ImageNodes = "token"
    rank_by: str = "abs"
    prune: bool = True
    refine: int = 8
    n_resamples: int = 1000
    seed: int = 0

    def __post_init__(self) -> None:
        check_count(self.refine, "CircuitSettings.refine", min=2)
        check_count(self.n_resamples, "CircuitSettings.n_resamples")
        check_count(self.seed, "CircuitSettings.seed", min=0)
        ranked(torch.zeros(1), self.rank_by)  # refuses an unknown rank_by


def extract_circuit(model: HookedVLM, pairs: Any, scores: EdgeScores | None = None, target: float | None = 0.9,
                    top_k: int | None = None, metric: MetricFn | None = None, settings: CircuitSettings | None = None,
                    options: SweepOptions | None = None) -> Circuit:
    """The smallest top-ranked edge set whose exact faithfulness reaches `target` (or the top `top_k`).

    Args:
        pairs: a `PairBatch` or pairs; the circuit is measured on them.
        scores: edge scores to rank by (default: `edge_attribution(model, pairs, ...)` with
            `settings.method`, `ig_steps`, `image_nodes`).
        target: faithfulness to reach (in (0, 1]); ignored when `top_k` is given.
        top_k: take exactly the top k edges instead (the curve is still measured).
        metric: as `edge_attribution` (the one the scores were computed with).
        settings: `CircuitSettings` (ranking, pruning, refinement, bootstrap).
        options: `vlens.SweepOptions`: batch_size, max_batch, readout, progress, sharding.
    """
    if top_k is None and target is None:
        raise UserInputError("give a target faithfulness (e.g. target=0.9) or top_k")
    if top_k is None:
        target = check_float(target, "target", min=0.0, max=1.0, min_open=True)
    settings = CircuitSettings() if settings is None else settings
    if not isinstance(settings, CircuitSettings):
        raise UserInputError(f"settings must be a vlens.circuits.CircuitSettings, got {type(settings).__name__}")
    options = circuit_options(options, "extract_circuit")
    rank_by, prune, refine, n_resamples, seed = (settings.rank_by, settings.prune, settings.refine,
                                                 settings.n_resamples, settings.seed)
    batch, picture = pair_batch(model, pairs)
    if scores is None:
        scores = edge_attribution(model, batch, metric=metric, method=settings.method, ig_steps=settings.ig_steps,
                                  image_nodes=settings.image_nodes, options=options)
        scores.thumbnail = scores.thumbnail or picture
    graph = scores.graph
    if len(scores.pair_ids) != batch.n_pairs or list(scores.pair_ids) != list(batch.pair_ids):
        raise UserInputError("scores were computed on other pairs than these: pass the same pairs (or no scores)")
    require_sequential_blocks(model)
    expected = CircuitGraph.for_batch(model, batch.clean.token_regions, graph.image_nodes)
    if expected.n_edges != graph.n_edges:
        raise UserInputError(f"scores hold {graph.n_edges} edges, these pairs' graph {expected.n_edges}")
    if top_k is not None:
        top_k = check_count(top_k, "top_k", max=graph.n_edges)
    circuit_metric = CircuitMetric(batch, metric, options.readout)
    order = ranked(scores.scores, rank_by)
    measured: dict[int, dict] = {}
    sets: dict[int, Tensor] = {}
    runs: dict = {}  # the pairs' clean and corrupt runs, shared by every round
    clean = corrupt = torch.zeros(0)

    def measure(ks: list[int]) -> None:
        nonlocal clean, corrupt
        ks = sorted({k for k in ks if k not in measured})
        if not ks:
            return
        for k in ks:
            sets[k] = circuit_edges(graph, order, k, prune)
        values = run_conditions(model, graph, batch, circuit_metric, [Condition(sets[k], invert=True) for k in ks],
                                options, desc="circuit faithfulness", cache=runs)
        clean, corrupt = values.clean, values.corrupt
        value = faithfulness(values.patched, clean, corrupt)
        low, high = faithfulness_interval(values.patched, clean, corrupt, n_resamples, seed)
        for i, k in enumerate(ks):
            measured[k] = {"k": k, "n_edges": len(sets[k]), "faithfulness": float(value[i]), "low": float(low[i]),
                           "high": float(high[i]), "per_pair": values.patched[i]}

    grid = doubling_grid(graph.n_edges)
    measure(grid + ([top_k] if top_k is not None else []))
    if top_k is not None:
        chosen = top_k
    else:
        assert target is not None
        reached = [k for k in grid if measured[k]["faithfulness"] >= target]
        chosen = reached[0] if reached else graph.n_edges
        below = max([k for k in grid if k < chosen], default=0)
        while chosen - below > 1:  # narrow the bracket (below, chosen]
            step = max(1, (chosen - below) // refine)
            candidates = list(range(below + step, chosen, step))[:refine]
            if not candidates:
                break
            measure(candidates)
            hits = [k for k in candidates if measured[k]["faithfulness"] >= target]
            if hits:
                chosen = hits[0]
            below = max([k for k in candidates if k < chosen], default=below)
            if step == 1:
                break
    point = measured[chosen]
    curve = [{key: value for key, value in measured[k].items() if key != "per_pair"} for k in sorted(measured)]
    return Circuit(scores=scores, edges=sets[chosen].tolist(), k=chosen, faithfulness=point["faithfulness"],
                   interval=(point["low"], point["high"]), target=None if top_k is not None else target, curve=cast(list[CurvePoint], curve),
                   per_pair_metric=point["per_pair"], clean_metric=clean, corrupt_metric=corrupt, rank_by=rank_by,
                   pruned=prune)

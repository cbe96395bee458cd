"""The knockout sweep over layer windows (Zhang et al., CVPR 2025; Geva et al. 2023 for text).

    result = knockout_sweep(model, batch, edges=["image->final", "question->final"], window=3)
    result.plot().show(); result.save("out/")

For each edge "SRC->DST" (attention from DST's queries to SRC's keys) and each layer window, the
edge is knocked out at the window's layers (`vlens.flow.knockout`) and, per example, the answer's
probability p at the final position and its logit margin (the answer's logit minus the largest other
logit) are compared with the clean run:

    relative probability change = (p_knockout - p_clean) / p_clean
    margin change                = margin_knockout - margin_clean

reported as the mean over examples with a 95% percentile-bootstrap interval (`vlens.utils.stats`).
Windows: one per softmax-attention layer l, the k layers centred on it (l - (k-1)//2 .. l + k//2 in the
list of softmax-attention layers, clipped at both ends; Geva et al.'s window). Each window is one
batched forward per chunk of examples, resumed from the clean residual entering the window's first
layer (the layers before it are unchanged by the knockout).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from jaxtyping import Float
from torch import Tensor
from tqdm.auto import tqdm

from vlens.flow.batch import FlowBatch
from vlens.flow.knockout import knockout, softmax_layers
from vlens.flow.positions import REGION_NAMES
from vlens.utils.errors import UserInputError
from vlens.utils.results import Result, own_fields
from vlens.utils.stats import bootstrap_interval
from vlens.utils.validation import check_count
from vlens.viz.optional import require_plotly

if TYPE_CHECKING:
    from vlens.core.model import HookedVLM

DEFAULT_EDGES = ("image->final", "image->question", "question->final", "object->final")
ENDPOINTS = (*REGION_NAMES, "object")


def parse_edge(edge: str) -> tuple[str, str]:
    """"SRC->DST" -> (src, dst), each a region name or "object"."""
    parts = [part.strip() for part in str(edge).split("->")]
    if len(parts) != 2 or not all(parts) or any(part not in ENDPOINTS for part in parts):
        raise UserInputError(f"edge {edge!r}: write it SRC->DST with SRC and DST among {', '.join(ENDPOINTS)} "
                             "(e.g. image->final)")
    return parts[0], parts[1]


def layer_windows(layers: Sequence[int], window: int) -> list[list[int]]:
    """One window per layer of `layers`: the `window` layers centred on it, clipped at both ends."""
    check_count(window, "window")
    layers = list(layers)
    before, after = (window - 1) // 2, window // 2
    return [layers[max(0, i - before): i + after + 1] for i in range(len(layers))]


@dataclass(frozen=True)
class SweepSettings:
    """edges: "SRC->DST" strings (`parse_edge`); window: layers per window; batch_size: examples per forward;
    n_resamples / seed: the bootstrap of the intervals."""

    edges: tuple[str, ...] = DEFAULT_EDGES
    window: int = 3
    batch_size: int = 16
    n_resamples: int = 1000
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.edges:
            raise UserInputError("the knockout sweep needs at least one edge")
        for edge in self.edges:
            parse_edge(edge)
        check_count(self.window, "window")
        check_count(self.batch_size, "batch_size")
        check_count(self.n_resamples, "n_resamples")


@dataclass
class KnockoutSweep(Result):
    """Per edge and window, the answer's relative probability change and margin change.

    Attributes:
        settings: the `SweepSettings` as a dict; batch: the examples' name; n: number of examples.
        windows: the layers of each window; centres: the layer each window is centred on.
        clean_prob: [n] the answer's probability without knockout; clean_margin: [n].
        prob_change / margin_change: edge -> [n_windows][n] per-example values.
        summary: edge -> {"prob": {"mean", "low", "high"} lists over windows, "margin": the same}.
    """

    kind = "knockout_sweep"
    # checked when a file is read: per window, and per example inside each window
    saved_dims: ClassVar[dict[str, str]] = {"n": "n_examples", "windows": "n_windows", "centres": "n_windows",
                                            "clean_prob": "n_examples", "clean_margin": "n_examples",
                                            "prob_change[*]": "n_windows", "margin_change[*]": "n_windows"}

    settings: dict
    batch: str
    n: int
    windows: list[list[int]]
    centres: list[int]
    clean_prob: list[float]
    clean_margin: list[float]
    prob_change: dict[str, list[list[float]]]
    margin_change: dict[str, list[list[float]]]
    summary: dict[str, dict[str, dict[str, list[float]]]] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> KnockoutSweep:
        return cls(**own_fields(cls, data))

    def strongest(self, edge: str) -> tuple[int, float]:
        """(centre layer, mean relative probability change) of the window where knocking `edge` out hurts most."""
        means = self.summary[edge]["prob"]["mean"]
        index = min(range(len(means)), key=lambda i: means[i])
        return self.centres[index], means[index]

    def table(self) -> str:
        """A Markdown table: per edge, the mean relative probability change [95% interval] per window."""
        head = "| edge | " + " | ".join(f"L{c}" for c in self.centres) + " |"
        lines = [head, "|" + "---|" * (len(self.centres) + 1)]
        for edge, stats in self.summary.items():
            prob = stats["prob"]
            cells = [f"{m:+.2f} [{lo:+.2f}, {hi:+.2f}]" for m, lo, hi in zip(prob["mean"], prob["low"], prob["high"],
                                                                           strict=True)]
            lines.append(f"| {edge} | " + " | ".join(cells) + " |")
        return "\n".join(lines)

    def plot(self, metric: str = "prob", **_: Any) -> Any:
        """Mean change per window centre, one line per edge, with its interval as a band (plotly)."""
        go = require_plotly()
        figure = go.Figure()
        for edge, stats in self.summary.items():
            s = stats[metric]
            figure.add_trace(go.Scatter(x=self.centres + self.centres[::-1], y=s["high"] + s["low"][::-1],
                                        fill="toself", opacity=0.2, line={"width": 0}, showlegend=False,
                                        hoverinfo="skip", name=edge))
            figure.add_trace(go.Scatter(x=self.centres, y=s["mean"], mode="lines+markers", name=edge))
        label = "relative change in p(answer)" if metric == "prob" else "change in the answer's logit margin"
        figure.update_layout(title=f"Attention knockout, window {self.settings['window']} ({self.batch}, n={self.n})",
                             xaxis_title="window centre (layer)", yaxis_title=label)
        return figure


def answer_scores(logits: Float[Tensor, "batch d_vocab"], answers: Tensor) -> tuple[Tensor, Tensor]:
    """(p(answer), answer logit minus the largest other logit), each [batch], in float64 on the CPU."""
    logits = logits.detach().double().cpu()
    rows = torch.arange(len(answers))
    prob = logits.softmax(-1)[rows, answers]
    own = logits[rows, answers]
    others = logits.clone()
    others[rows, answers] = float("-inf")
    return prob, own - others.max(-1).values


def final_logits(model: HookedVLM, inputs, resid: Tensor | None = None, start: int = 0,
                 state=None) -> Float[Tensor, "batch d_vocab"]:
    """Logits at each row's final position; with `resid` (the residual entering block `start`) and the run's
    `state`, only blocks start.. run."""
    if state is None:
        state = model.start_run(inputs)
    resid = model.run_blocks(state.resid if resid is None else resid, state, start)
    final = inputs.token_regions.final.to(resid.device)
    last = resid[torch.arange(resid.shape[0], device=resid.device), final]
    return model.finish(last[:, None])[:, 0]


def clean_residuals(model: HookedVLM, inputs, state) -> tuple[list[Tensor], Tensor]:
    """(the residual entering each block, final logits) of a clean run."""
    resid, entering = state.resid, []
    for layer in range(model.cfg.n_layers):
        entering.append(resid)
        resid = model.run_blocks(resid, state, layer, layer + 1)
    final = inputs.token_regions.final.to(resid.device)
    last = resid[torch.arange(resid.shape[0], device=resid.device), final]
    return entering, model.finish(last[:, None])[:, 0]


def _endpoint(name: str, objects: Sequence[Any] | None) -> Any:
    if name != "object":
        return name
    if objects is None:
        raise UserInputError("the edge names 'object' but some example has no object box; give every example a box "
                             "(records with 'objects' and one 'targets' id) or leave object edges out")
    return objects


def knockout_sweep(model: HookedVLM, batch: FlowBatch, edges: Sequence[str] = DEFAULT_EDGES, window: int = 3,
                   settings: SweepSettings | None = None, progress: bool = True) -> KnockoutSweep:
    """Knock each edge out in each layer window and measure the answer's change (see the module docstring).

    Args:
        model: a HookedVLM. batch: the examples (`FlowBatch`: image, question, answer, object box).
        edges: "SRC->DST" with SRC / DST a region ("image", "question", "text", "final", "prompt", "all") or
            "object" (the tokens of the example's object box). window: layers per window.
        settings: overrides edges and window when given (batch size, bootstrap).
    Returns a `KnockoutSweep` (per-example values [n_windows][n] per edge, means with intervals).
    """
    settings = settings or SweepSettings(edges=tuple(edges), window=window)
    parsed = {edge: parse_edge(edge) for edge in settings.edges}
    windows = layer_windows(softmax_layers(model), settings.window)
    centres = softmax_layers(model)
    n = len(batch)
    clean_prob, clean_margin = torch.zeros(n, dtype=torch.float64), torch.zeros(n, dtype=torch.float64)
    prob = {edge: torch.zeros(len(windows), n, dtype=torch.float64) for edge in parsed}
    margin = {edge: torch.zeros(len(windows), n, dtype=torch.float64) for edge in parsed}
    chunks = [list(range(s, min(s + settings.batch_size, n))) for s in range(0, n, settings.batch_size)]
    bar = tqdm(total=len(chunks) * len(parsed) * len(windows), desc="knockout sweep", disable=not progress)
    with torch.no_grad():
        for rows in chunks:
            inputs, answers, objects = batch.encode(model, rows)
            state = model.start_run(inputs)
            entering, clean = clean_residuals(model, inputs, state)
            p0, m0 = answer_scores(clean, answers)
            clean_prob[rows], clean_margin[rows] = p0, m0
            for edge, (src, dst) in parsed.items():
                src_spec, dst_spec = _endpoint(src, objects), _endpoint(dst, objects)
                for w, layers in enumerate(windows):
                    with knockout(model, src_spec, dst_spec, layers=layers, inputs=inputs):
                        logits = final_logits(model, inputs, entering[layers[0]], layers[0], state)
                    p, m = answer_scores(logits, answers)
                    prob[edge][w, rows] = (p - p0) / p0
                    margin[edge][w, rows] = m - m0
                    bar.update()
    bar.close()
    summary: dict[str, dict[str, dict[str, list[float]]]] = {}
    for edge in parsed:
        summary[edge] = {}
        for metric, values in (("prob", prob[edge]), ("margin", margin[edge])):
            low, high = bootstrap_interval(values.T, n_resamples=settings.n_resamples, seed=settings.seed)
            summary[edge][metric] = {"mean": values.mean(1).tolist(), "low": low.tolist(), "high": high.tolist()}
    return KnockoutSweep(settings={**asdict(settings), "edges": list(settings.edges)}, batch=batch.name, n=n, windows=windows, centres=centres,
                         clean_prob=clean_prob.tolist(), clean_margin=clean_margin.tolist(),
                         prob_change={e: v.tolist() for e, v in prob.items()},
                         margin_change={e: v.tolist() for e, v in margin.items()}, summary=summary)

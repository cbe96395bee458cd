"""The information-flow study (Zhang et al., CVPR 2025; Geva et al. 2023): `vlens study flow`.

Design: for each task (default "colour" and "name"), knock out image->final, image->question,
question->final and object->final in every window of k layers (`vlens.flow.knockout_sweep`; k default
max(1, n_layers // 4)) and measure the answer's relative probability change with 95% bootstrap
intervals over examples. Stated per edge and task: where in depth knocking the edge out matters —
the window with the most negative mean change, its relative depth (centre / (n_layers - 1)), and
whether its interval lies wholly below 0 ("matters") or not ("no effect shown").
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any, ClassVar, Literal, TypedDict

from vlens.flow import DEFAULT_EDGES, KnockoutSweep, SweepSettings, knockout_sweep, object_task_batch
from vlens.flow.batch import TASK_NAMES
from vlens.utils.errors import UserInputError
from vlens.utils.results import Result, own_fields
from vlens.utils.validation import check_choice, check_count
from vlens.viz.optional import require_make_subplots
from vlens.zoo.image_sizes import OBJECT_IMAGE_SIZE, render_size

if TYPE_CHECKING:
    from vlens.core.model import HookedVLM

SEED_BASE = 371_000_000  # away from the embedded model's training and held-out seed ranges


@dataclass(frozen=True)
class FlowSettings:
    """tasks, n examples per task, edges, window (None: max(1, n_layers // 4)), image size (None: the square size
    the model pins, else 64 px), batch size, seed."""

    tasks: tuple[str, ...] = ("colour", "name")
    n: int = 64
    edges: tuple[str, ...] = DEFAULT_EDGES
    window: int | None = None
    size: int | None = None  # None: the size the model pins, else OBJECT_IMAGE_SIZE (64 px)
    batch_size: int = 16
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.tasks:
            raise UserInputError("the flow study needs at least one task")
        for task in self.tasks:
            check_choice(task, "task", TASK_NAMES)
        check_count(self.n, "n")
        if self.window is not None:
            check_count(self.window, "window")
        SweepSettings(edges=self.edges, window=self.window or 1)  # checks the edges


class Finding(TypedDict):
    """Where in depth one edge's knockout matters most on one task (`findings`; checked when a file is read)."""

    centre: int
    layers: list[int]
    depth: float
    mean: float
    low: float
    high: float
    verdict: Literal["matters", "no effect shown"]


@dataclass
class FlowStudy(Result):
    """Per task a `KnockoutSweep` (as a dict) and, per edge, where in depth its knockout matters."""

    kind = "flow_study"
    # results kept as the dicts their kinds wrote, read back and checked when a file is read
    nested_results: ClassVar[tuple[str, ...]] = ("sweeps",)

    settings: dict
    model: str
    n_layers: int
    sweeps: dict[str, dict] = field(default_factory=dict)  # task -> KnockoutSweep dict
    findings: dict[str, dict[str, Finding]] = field(default_factory=dict)  # task -> edge -> finding

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> FlowStudy:
        return cls(**own_fields(cls, data))

    def sweep(self, task: str) -> KnockoutSweep:
        return KnockoutSweep.from_dict(self.sweeps[task])

    def report(self) -> str:
        lines = [f"# Information flow by attention knockout ({self.model})", "",
                 f"Window {self.settings['window']} of {self.n_layers} layers; relative change in p(answer) with "
                 "its 95% bootstrap interval. Per edge: the window where knocking it out hurts most.", "",
                 "| task | edge | strongest window (centre) | relative depth | change [95% CI] | verdict |",
                 "|---|---|---|---|---|---|"]
        for task, edges in self.findings.items():
            for edge, f in edges.items():
                lines.append(f"| {task} | {edge} | L{f['centre']} ({f['layers'][0]}-{f['layers'][-1]}) | "
                             f"{f['depth']:.2f} | {f['mean']:+.2f} [{f['low']:+.2f}, {f['high']:+.2f}] | {f['verdict']} |")
        for task in self.sweeps:
            lines += ["", f"## {task}: every window", "", self.sweep(task).table()]
        lines += ["", "Figure: flow.html (one panel per task; lines: edges; bands: intervals)."]
        return "\n".join(lines)

    def plot(self, **_: Any) -> Any:
        tasks = list(self.sweeps)
        figure = require_make_subplots()(rows=1, cols=len(tasks), subplot_titles=tasks, shared_yaxes=True)
        for col, task in enumerate(tasks, start=1):
            for trace in self.sweep(task).plot().data:
                trace.showlegend = col == 1 and trace.showlegend is not False
                figure.add_trace(trace, row=1, col=col)
        figure.update_layout(title=f"Attention knockout over layer windows ({self.model})",
                             yaxis_title="relative change in p(answer)")
        figure.update_xaxes(title_text="window centre (layer)")
        return figure


def findings(sweep: KnockoutSweep, n_layers: int) -> dict[str, Finding]:
    """Per edge: the window with the most negative mean relative change, its depth and interval, the verdict."""
    out: dict[str, Finding] = {}
    for edge, stats in sweep.summary.items():
        prob = stats["prob"]
        index = min(range(len(prob["mean"])), key=lambda i: prob["mean"][i])
        high = prob["high"][index]
        out[edge] = {"centre": sweep.centres[index], "layers": sweep.windows[index],
                     "depth": sweep.centres[index] / max(n_layers - 1, 1), "mean": prob["mean"][index],
                     "low": prob["low"][index], "high": high,
                     "verdict": "matters" if high < 0 else "no effect shown"}
    return out


def run_flow_study(model: HookedVLM, settings: FlowSettings, model_name: str = "model",
                   progress: bool = True) -> FlowStudy:
    """Run the sweep on every task (module docstring) and locate each edge's effect in depth."""
    window = settings.window or max(1, model.cfg.n_layers // 4)
    size = render_size(model, settings.size, fallback=OBJECT_IMAGE_SIZE)
    settings = replace(settings, size=size)  # recorded as drawn
    sweeps, found = {}, {}
    for t, task in enumerate(settings.tasks):
        batch = object_task_batch(task, settings.n, seed=SEED_BASE + 1_000_000 * t + settings.seed, size=size)
        edges = settings.edges if batch.has_objects else tuple(e for e in settings.edges if "object" not in e)
        sweep = knockout_sweep(model, batch, settings=SweepSettings(edges=edges, window=window,
                                                                    batch_size=settings.batch_size, seed=settings.seed),
                               progress=progress)
        sweeps[task] = sweep.to_dict()
        found[task] = findings(sweep, model.cfg.n_layers)
    return FlowStudy(settings={**asdict(settings), "edges": list(settings.edges), "tasks": list(settings.tasks),
                               "window": window},
                     model=model_name, n_layers=model.cfg.n_layers, sweeps=sweeps, findings=found)

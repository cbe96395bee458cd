"""Object-token ablation as a study (Neo et al., ICLR 2025), on any model: `vlens study object-tokens`.

Design: for each task (default "name": "What is the object in the image?", and "colour": "What colour
is the {shape}?", the phrasing the embedded model was trained on) and each site (the vision output and
the residual entering the middle decoder layer), mean-ablate each example's object tokens plus a
one-cell buffer, as many random image tokens, and as many highest-norm image tokens
(`vlens.flow.ablate_tokens`). Stated claim, tested per (task, site): ablating the object's tokens
lowers answer accuracy more than ablating as many random image tokens — supported when the accuracy
drop is larger and the exact McNemar test of the paired outcomes gives p < 0.05.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any, ClassVar, Literal, TypedDict

from vlens.flow import TokenAblation, ablate_tokens, object_task_batch
from vlens.flow.batch import TASK_NAMES
from vlens.utils.errors import UserInputError
from vlens.utils.results import Result, own_fields
from vlens.utils.validation import check_choice, check_count
from vlens.viz.optional import require_plotly
from vlens.zoo.image_sizes import OBJECT_IMAGE_SIZE, render_size

if TYPE_CHECKING:
    from vlens.core.model import HookedVLM

ALPHA = 0.05
SEED_BASE = 370_000_000  # away from the embedded model's training and held-out seed ranges


@dataclass(frozen=True)
class ObjectTokenSettings:
    """tasks: object tasks (`vlens.flow.batch.TASK_NAMES`); n: examples per task; sites: "vision" and / or
    decoder layers ("middle": n_layers // 2); how / buffer: the ablation; size: image side in px (None: the
    square size the model pins, else 64 px)."""

    tasks: tuple[str, ...] = ("name", "colour")
    n: int = 64
    sites: tuple[str, ...] = ("vision", "middle")
    how: str = "mean"
    buffer: int = 1
    size: int | None = None  # None: the size the model pins, else OBJECT_IMAGE_SIZE (64 px)
    batch_size: int = 16
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.tasks or not self.sites:
            raise UserInputError("the object-token study needs at least one task and one site")
        for task in self.tasks:
            check_choice(task, "task", TASK_NAMES)
        for site in self.sites:
            if site not in ("vision", "middle") and not str(site).isdigit():
                raise UserInputError(f"site {site!r}: use 'vision', 'middle' or a decoder layer number")
        check_choice(self.how, "how", ("mean", "zero", "resample"))
        check_count(self.n, "n")
        check_count(self.buffer, "buffer", min=0)

    def layer(self, site: str, n_layers: int) -> str | int:
        return "vision" if site == "vision" else n_layers // 2 if site == "middle" else int(site)


class Claim(TypedDict):
    """The claim's test on one (task, site): accuracy drops, the p-value, the verdict."""

    object_drop: float
    random_drop: float
    p: float
    verdict: Literal["supported", "not supported"]


class Run(TypedDict):
    """One (task, site) of the study as results.json records it (checked when a file is read; `ablation` as a
    token_ablation result, through `nested_results`)."""

    task: str
    site: str | int  # a site name, or a layer
    ablation: dict[str, Any]
    claim: Claim


@dataclass
class ObjectTokenStudy(Result):
    """Per (task, site) a `TokenAblation` (as a dict) and the claim's verdict."""

    kind = "object_token_study"
    # results kept as the dicts their kinds wrote, read back and checked when a file is read
    nested_results: ClassVar[tuple[str, ...]] = ("runs",)

    settings: dict
    model: str
    runs: list[Run] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> ObjectTokenStudy:
        return cls(**own_fields(cls, data))

    def ablation(self, task: str, site: str | int) -> TokenAblation:
        for run in self.runs:
            if run["task"] == task and str(run["site"]) == str(site):
                return TokenAblation.from_dict(run["ablation"])
        raise UserInputError(f"no run for task {task!r} at site {site!r}")

    def report(self) -> str:
        lines = [f"# Object-token ablation ({self.model})", "",
                 "Claim tested per task and site: ablating the object's tokens (+ buffer) lowers answer accuracy "
                 f"more than ablating as many random image tokens (exact McNemar, p < {ALPHA}).", "",
                 "| task | site | clean | object | random | register | object vs random | verdict |",
                 "|---|---|---|---|---|---|---|---|"]
        for run in self.runs:
            ab = TokenAblation.from_dict(run["ablation"])
            acc = {c: f"{v['value']:.2f} [{v['low']:.2f}, {v['high']:.2f}]" for c, v in ab.accuracy.items()}
            claim = run["claim"]
            lines.append(f"| {run['task']} | {run['site']} | {acc['clean']} | {acc['object']} | {acc['random']} | "
                         f"{acc['register']} | drop {claim['object_drop']:+.2f} vs {claim['random_drop']:+.2f}, "
                         f"p = {claim['p']:.3g} | {claim['verdict']} |")
        lines += ["", "Accuracy [95% Wilson interval]; the p(answer) drops, token counts and register outliers are in "
                  "results.json. Figure: object_tokens.html."]
        return "\n".join(lines)

    def plot(self, **_: Any) -> Any:
        """Accuracy drop per condition, one group per (task, site)."""
        go = require_plotly()
        figure = go.Figure()
        labels = [f"{run['task']} @ {run['site']}" for run in self.runs]
        for condition in ("object", "random", "register"):
            drops = [TokenAblation.from_dict(run["ablation"]).accuracy_drop(condition) for run in self.runs]
            figure.add_trace(go.Bar(x=labels, y=drops, name=condition))
        figure.update_layout(barmode="group", title=f"Accuracy drop when tokens are ablated ({self.model})",
                             yaxis_title="clean accuracy - ablated accuracy")
        return figure


def run_object_token_study(model: HookedVLM, settings: ObjectTokenSettings, model_name: str = "model",
                           progress: bool = True) -> ObjectTokenStudy:
    """Run every (task, site) of the design (module docstring) and test the claim on each."""
    runs: list[Run] = []
    size = render_size(model, settings.size, fallback=OBJECT_IMAGE_SIZE)
    settings = replace(settings, size=size)  # recorded as drawn
    for t, task in enumerate(settings.tasks):
        batch = object_task_batch(task, settings.n, seed=SEED_BASE + 1_000_000 * t + settings.seed, size=size)
        for site in settings.sites:
            at = settings.layer(site, model.cfg.n_layers)
            ablation = ablate_tokens(model, batch, how=settings.how, at=at, buffer=settings.buffer, seed=settings.seed,
                                     batch_size=settings.batch_size, progress=progress)
            test = ablation.tests["object_vs_random"]
            object_drop, random_drop = ablation.accuracy_drop("object"), ablation.accuracy_drop("random")
            supported = object_drop > random_drop and test["p"] < ALPHA
            runs.append({"task": task, "site": at, "ablation": ablation.to_dict(),
                         "claim": {"object_drop": object_drop, "random_drop": random_drop, "p": test["p"],
                                   "verdict": "supported" if supported else "not supported"}})
    plain = {key: list(value) if isinstance(value, tuple) else value for key, value in asdict(settings).items()}
    return ObjectTokenStudy(settings=plain, model=model_name, runs=runs)

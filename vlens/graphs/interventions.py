"""Feature interventions: set, scale or zero transcoder features at chosen positions, three ways.

- predicted: the graph's linear answer. With ``M[t, s] = A[t, s] / a_s`` (the direct effect per unit of
  activation) between active features, the edited features' changes ``d_e`` fixed and every other active
  feature following its pre-activation (``d_t = sum_s M[t, s] d_s``; features that were off stay off),
  the target moves by ``sum_s A[target, s] / a_s * d_s``.
- replacement: the replacement model of the prompt (frozen attention, norms and errors; features
  recomputed, non-linearly, from their inputs) with the edit at ``blocks.{l}.hook_tc_acts``.
- real: the real model with the transcoders spliced in and the error term recomputed in the same
  forward (``mlp_out - decode(unedited features)``), so only the edit changes anything.

Predicted equals replacement exactly while no feature crosses its threshold; replacement and real
differ by what freezing attention, norms and errors leaves out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, TypedDict, cast

import torch
from torch import Tensor

from vlens.graphs.replacement import ReplacementModel
from vlens.graphs.results import AttributionGraph
from vlens.transcoders.splice import splice_transcoders
from vlens.utils.errors import UserInputError
from vlens.utils.results import Result
from vlens.utils.validation import check_choice

MODES = ("set", "scale", "zero")


@dataclass(frozen=True)
class FeatureEdit:
    """Feature `feature` of decoder layer `layer` at `positions` (None: every position): "set" to `value`,
    "scale" by `value`, or "zero"."""

    layer: int
    feature: int
    positions: tuple[int, ...] | None = None
    mode: str = "zero"
    value: float = 0.0

    def __post_init__(self) -> None:
        check_choice(self.mode, "mode", MODES)

    def apply(self, acts: Tensor) -> Tensor:
        """`acts` [batch, pos, d_tc] with the edit made (a new tensor)."""
        out = acts.clone()
        where = (slice(None), list(self.positions) if self.positions is not None else slice(None), self.feature)
        if self.mode == "zero":
            out[where] = 0.0
        elif self.mode == "scale":
            out[where] = out[where] * self.value
        else:
            out[where] = self.value
        return out


def edits_for(graph: AttributionGraph, names: Sequence[str], mode: str = "zero", value: float = 0.0) -> list[FeatureEdit]:
    """Edits of the feature nodes (``L{l}F{i}@{pos}``) or supernodes named in `names`, each at its own position."""
    edits = []
    for name in names:
        members = graph.supernodes.get(name, [name])
        for member in members:
            node = graph.nodes[graph.index(member)]
            if node["kind"] != "feature":
                raise UserInputError(f"{member} is a {node['kind']} node: interventions edit feature nodes (L2F17@5).")
            edits.append(FeatureEdit(cast(int, node["layer"]), cast(int, node["feature"]), (node["pos"],), mode, value))
    return edits


EditMode = Literal["set", "scale", "zero"]


class EditRecord(TypedDict):
    """A `FeatureEdit` as results.json records it (checked when a file is read)."""

    layer: int
    feature: int
    positions: list[int] | None
    mode: EditMode
    value: float


@dataclass
class InterventionResult(Result):
    """The target before and after the edits: predicted by the graph, in the replacement model, in the real model."""

    edits: list[EditRecord]
    target: str
    clean: float
    predicted: float | None
    replacement: float
    real: float
    notes: list[str] = field(default_factory=list)

    kind: ClassVar[str] = "feature_intervention"

    def to_dict(self) -> dict:
        return {"kind": "feature_intervention", "edits": self.edits, "target": self.target, "clean": self.clean,
                "predicted": self.predicted, "replacement": self.replacement, "real": self.real, "notes": self.notes,
                "effects": {"predicted": None if self.predicted is None else self.predicted - self.clean,
                            "replacement": self.replacement - self.clean, "real": self.real - self.clean}}

    @classmethod
    def from_dict(cls, data: dict) -> InterventionResult:
        return cls(edits=list(data["edits"]), target=data["target"], clean=data["clean"], predicted=data["predicted"],
                   replacement=data["replacement"], real=data["real"], notes=list(data.get("notes", [])))

    def plot(self, *args: Any, **kwargs: Any) -> Any:
        import plotly.graph_objects as go

        names = ["predicted", "replacement", "real"]
        values = [self.predicted, self.replacement, self.real]
        figure = go.Figure(go.Bar(x=names, y=[None if v is None else v - self.clean for v in values]))
        return figure.update_layout(title=f"effect of the edits on {self.target}", yaxis_title="change")


def edit_hooks(edits: Sequence[FeatureEdit]) -> list[tuple[str, Any]]:
    by_layer: dict[int, list[FeatureEdit]] = {}
    for edit in edits:
        by_layer.setdefault(edit.layer, []).append(edit)

    def hook_for(layer_edits: list[FeatureEdit]):
        def hook(acts: Tensor, hook: Any = None) -> Tensor:
            for edit in layer_edits:
                acts = edit.apply(acts)
            return acts
        return hook

    return [(f"blocks.{layer}.hook_tc_acts", hook_for(layer_edits)) for layer, layer_edits in by_layer.items()]


def target_value(graph: AttributionGraph, logits: Tensor) -> float:
    last = logits[0, -1].double()
    value = last[graph.target["token_id"]]
    if graph.target["contrast_id"] is not None:
        value = value - last[graph.target["contrast_id"]]
    return float(value)


def predicted_value(graph: AttributionGraph, edits: Sequence[FeatureEdit]) -> tuple[float | None, list[str]]:
    """The graph's linear prediction of the target after `edits` (module doc); None when an edited feature is
    not an attributed node of the graph."""
    n_feat = graph.n_features
    activation = torch.tensor([float(cast(float, graph.nodes[k]["activation"])) for k in range(n_feat)], dtype=torch.float64)
    per_unit = graph.adjacency[:n_feat, :n_feat] / activation[None, :]
    change = torch.zeros(n_feat, dtype=torch.float64)
    clamped = torch.zeros(n_feat, dtype=torch.bool)
    notes = []
    for edit in edits:
        hits = [k for k in range(n_feat) if graph.nodes[k]["layer"] == edit.layer and graph.nodes[k]["feature"] == edit.feature
                and (edit.positions is None or graph.nodes[k]["pos"] in edit.positions)]
        if not hits:
            notes.append(f"L{edit.layer}F{edit.feature} is active nowhere the edit reaches: nothing to predict for it")
        for k in hits:
            a = float(activation[k])
            new = 0.0 if edit.mode == "zero" else a * edit.value if edit.mode == "scale" else edit.value
            change[k], clamped[k] = new - a, True
    if any(abs(d or 0.0) > 0 for d in graph.dropped):
        return None, notes + ["the graph left active features out (max_features): no prediction"]
    free = ~clamped
    for _ in range(len(graph.nodes)):  # acyclic: settles within as many rounds as layers
        update = torch.where(free, per_unit @ change, change)
        if torch.allclose(update, change, rtol=0, atol=0):
            break
        change = update
    row = graph.adjacency[-1, :n_feat] / activation
    return float(graph.target["value"]) + float(row @ change), notes


@torch.no_grad()
def intervene(replacement: ReplacementModel, inputs: Any, graph: AttributionGraph, edits: Sequence[FeatureEdit]
              ) -> InterventionResult:
    """The target of `graph` after `edits`: predicted, in the replacement model and in the real model (module doc)."""
    if not edits:
        raise UserInputError("intervene needs at least one FeatureEdit.")
    model, tc = replacement.model, replacement.transcoders
    for edit in edits:
        if edit.layer not in tc.cfg.layers:
            raise UserInputError(f"layer {edit.layer} has no transcoder (covered: {list(tc.cfg.layers)}).")
        if not 0 <= edit.feature < tc.cfg.d_tc:
            raise UserInputError(f"feature {edit.feature} is outside [0, {tc.cfg.d_tc}).")
    inputs = model.coerce_inputs(inputs)
    run = replacement.run(inputs)
    hooks = edit_hooks(edits)
    with replacement.frozen(run), model.hooks(fwd_hooks=hooks):
        replaced = target_value(graph, model(inputs))
    with splice_transcoders(model, tc, error="live"), model.hooks(fwd_hooks=hooks):
        real = target_value(graph, model(inputs))
    predicted, notes = predicted_value(graph, edits)
    return InterventionResult(edits=[EditRecord(layer=edit.layer, feature=edit.feature, mode=cast(EditMode, edit.mode),
                                                positions=None if edit.positions is None else list(edit.positions),
                                                value=edit.value) for edit in edits], target=graph.nodes[-1]["name"],
                              clean=target_value(graph, run.logits), predicted=predicted, replacement=replaced,
                              real=real, notes=notes)

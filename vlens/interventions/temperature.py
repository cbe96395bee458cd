"""Adaptive head temperature (docs/method.md, section 8): sharpen target heads at inference.

For each target head h, the attention logits are multiplied by an inverse temperature

    beta_h = alpha * gamma_h,    A_h = softmax(beta_h * Q_h K_h^T / sqrt(d_k))

with gamma_h the head's importance from a patching or ablation result.

Normalisation of gamma (our choice; the paper only says "importance measured by patching"):
importance scores I_h (e.g. the mean-ablation log-prob drop, or a layer-head patching
metric) of the selected heads are divided by the largest |I_h| of the selection, so the most
important head gets gamma = 1 and beta = alpha (1.2 by default, the paper's usual value).
`normalisation="mean"` divides by the mean instead, `"none"` uses I_h as is. Heads whose
importance is not positive are never selected. `floor` (default 1.0) clamps beta from below,
so a weakly important head is sharpened a little or left alone but never softened; pass
floor=None for the bare formula.

Where it acts:
- on a `HookedVLM`: hooks on `blocks.{l}.attn.hook_attn_scores` (scaled, pre-softmax;
  masked entries are re-masked by the core, so scaling never unmasks): `hooks()` for
  run_with_hooks / generate / evaluation backends, `applied(model)` as a context manager, or
  `attach(model)` persistently (returns a handle; `handle.remove()` takes it off).
- on a plain HF model: `export_to_hf(hf_model)` scales each target head's query after any
  per-head query norm (a forward hook on the module the family's adapter names in
  `query_norm`, else on its `query_projection`); rotary
  embedding is linear, so scaling q before it scales the scores by exactly beta. Returns a
  removable handle. The HF modules hooked are shared with a `HookedVLM` built on that HF
  model, so while the handle is active the HookedVLM is scaled too: use one or the other.
  Families without a query norm can also bake beta into the query projection's weights
  (`baked_state_dict`, written by `vlens temperature export`).
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, TypedDict, cast

import torch
from jaxtyping import Float
from torch import Tensor, nn

from vlens.core.architectures import adapter_for
from vlens.core.architectures.base import HFModule
from vlens.utils.errors import UserInputError
from vlens.utils.finite import warn_non_finite
from vlens.utils.results import Result
from vlens.utils.strict_json import loads_strict
from vlens.utils.validation import check_count, check_float
from vlens.viz.figures import layer_head_heatmap
from vlens.viz.optional import require_plotly

if TYPE_CHECKING:
    from vlens.core.model import HookedVLM


Head = tuple[int, int]
NORMALISATIONS = ("max", "mean", "none")
logger = logging.getLogger(__name__)
SELECTIONS = ("importance", "taxonomy")  # the top-k heads by importance, or the paper's head classes
TEMPERATURE_CLASSES = ("cross-modal routing", "counting aggregation")  # the paper's target heads


@dataclass
class HeadTemperature(Result):
    """Inverse temperatures of target heads: betas[(layer, head)] = alpha * gamma (floored)."""

    betas: dict[Head, float]
    alpha: float = 1.2
    gammas: dict[Head, float] = field(default_factory=dict)
    normalisation: str = "max"
    floor: float | None = 1.0
    source: dict = field(default_factory=dict)

    kind: ClassVar[str] = "head_temperature"

    def __post_init__(self):
        self.betas = {(int(layer), int(head)): float(b) for (layer, head), b in self.betas.items()}
        for head, beta in self.betas.items():
            if not beta > 0:
                raise UserInputError(f"beta of head L{head[0]}H{head[1]} must be positive, got {beta}")

    def floored(self) -> list[Head]:
        """Heads whose alpha * gamma fell below `floor`, so beta is the floor itself (with the default
        floor 1.0 these heads are selected but left unchanged)."""
        if self.floor is None:
            return []
        return sorted(head for head, gamma in self.gammas.items() if self.alpha * gamma < self.floor)

    def changed(self) -> list[Head]:
        """Selected heads whose attention logits the multiplier actually changes (beta != 1)."""
        return sorted(head for head, beta in self.betas.items() if abs(beta - 1.0) > 1e-12)

    def unchanged(self) -> list[Head]:
        """Selected heads left as they were (beta = 1: typically floored, alpha * gamma < 1)."""
        return sorted(head for head, beta in self.betas.items() if abs(beta - 1.0) <= 1e-12)

    def summary(self) -> str:
        """One line per selected head (gamma, beta, the change of its logits) and how many changed."""
        floored = set(self.floored())
        lines = []
        for head, beta in sorted(self.betas.items()):
            gamma = self.gammas.get(head)
            gamma_text = "" if gamma is None else f"gamma {gamma:.3f} -> "
            what = ("unchanged (alpha * gamma below the floor)" if head in floored else
                    "unchanged" if abs(beta - 1) <= 1e-12 else f"attention logits x{beta:.3f} ({100 * (beta - 1):+.1f}%)")
            lines.append(f"L{head[0]}H{head[1]}: {gamma_text}beta {beta:.3f}: {what}")
        lines.append(f"{len(self.changed())} of {len(self.betas)} selected heads changed"
                     + (f"; left at beta = 1: {', '.join(f'L{a}H{b}' for a, b in self.unchanged())}"
                        if self.unchanged() else ""))
        return "\n".join(lines)

    @property
    def layers(self) -> list[int]:
        return sorted({layer for layer, _ in self.betas})

    def layer_scales(self, layer: int, n_heads: int) -> Float[Tensor, "n_heads"]:
        """Per-head multiplier of one layer (1 for heads left alone)."""
        scales = torch.ones(n_heads)
        for (at, head), beta in self.betas.items():
            if at == layer:
                if not 0 <= head < n_heads:
                    raise UserInputError(f"head L{at}H{head} does not exist: the layer has {n_heads} heads")
                scales[head] = beta
        return scales

    def _check(self, n_layers: int) -> None:
        bad = [layer for layer in self.layers if not 0 <= layer < n_layers]
        if bad:
            raise UserInputError(f"temperature layers {bad} are outside the model's {n_layers} layers")

    # ------------------------------------------------------------------ HookedVLM
    def softmax_layers(self, is_linear: Callable[[int], bool]) -> list[int]:
        """The target layers that have attention scores; target heads on linear-attention layers
        (a hybrid decoder's Gated DeltaNet layers: no softmax, no temperature) are left alone, with a warning."""
        skipped = [layer for layer in self.layers if is_linear(layer)]
        if skipped:
            heads = ", ".join(f"L{layer}H{head}" for layer, head in sorted(self.betas) if layer in skipped)
            logger.warning("head temperature: %s %s on linear-attention layers, which have no attention scores "
                           "to sharpen; left unchanged", heads, "is" if len(heads.split(", ")) == 1 else "are")
        return [layer for layer in self.layers if layer not in skipped]

    def hooks(self, model: HookedVLM) -> list[tuple[str, Callable]]:
        """`[(hook name, fn)]` on `hook_attn_scores` of every target layer with softmax attention."""
        self._check(model.cfg.n_layers)
        out = []
        for layer in self.softmax_layers(model.cfg.is_linear_attention):
            scales = self.layer_scales(layer, model.cfg.n_heads)

            def scale_scores(scores: Tensor, hook=None, scales=scales) -> Tensor:
                # scores: [batch, n_heads, query_pos, key_pos]
                return scores * scales.to(scores.device, scores.dtype)[None, :, None, None]

            out.append((f"blocks.{layer}.attn.hook_attn_scores", scale_scores))
        return out

    @contextmanager
    def applied(self, model: HookedVLM) -> Iterator[None]:
        """Temperature on for the `with` block only (removed on exit, also on error)."""
        with model.hooks(fwd_hooks=self.hooks(model)):
            yield

    def attach(self, model: HookedVLM) -> TemperatureHandle:
        """Persistent mode: the hooks stay until `handle.remove()` (they survive model.reset_hooks())."""
        handles = []
        for name, fn in self.hooks(model):
            hook_point = model.hook_dict[name]
            handles.append((hook_point, hook_point.add_hook(fn, dir="fwd", is_permanent=True)))
        return TemperatureHandle(_remove_lens_handles, handles)

    # ------------------------------------------------------------------ plain HF model
    def export_to_hf(self, hf_model: HFModule) -> TemperatureHandle:
        """Scale each target head's query on an HF model (after q norm where the family has one).

        Works for any family the registry knows (the decoder layers come from its adapter).
        """
        adapter = adapter_for(hf_model)
        layers = adapter.decoder_layers(hf_model)
        self._check(len(layers))
        cfg = adapter.build_config(hf_model)
        n_heads = cfg.n_heads
        handles = []
        for layer in self.softmax_layers(cfg.is_linear_attention):
            scales = self.layer_scales(layer, n_heads)
            q_norm = adapter.query_norm(layers[layer])
            if q_norm is not None:  # the query just before rotary, heads on the adapter's axis
                handles.append(q_norm.register_forward_hook(_scale_normed(scales, adapter.query_norm_head_axis)))
            else:  # output [..., n_heads * d_head]
                projection = adapter.query_projection(layers[layer])
                fused = _fused_rows(projection)
                if fused is not None:
                    handles.append(fused[0].register_forward_hook(_scale_projected(scales, n_heads, fused[1:])))
                else:
                    handles.append(projection.register_forward_hook(_scale_projected(scales, n_heads)))
        return TemperatureHandle(lambda hs: [h.remove() for h in hs], handles)

    def baked_state_dict(self, hf_model: HFModule) -> dict[str, Tensor]:
        """The HF state dict with beta folded into each target head's query-projection rows (and bias).

        A permanent export that `save_pretrained(state_dict=...)` can write, for families
        without a q norm only: with one, the norm would undo a scaled projection (use
        `export_to_hf`'s hooks there). The live model is not changed.
        """
        adapter = adapter_for(hf_model)
        layers = adapter.decoder_layers(hf_model)
        self._check(len(layers))
        cfg = adapter.build_config(hf_model)
        n_heads = cfg.n_heads
        by_id = {id(m): name for name, m in hf_model.named_modules()}
        state = {k: v.detach() for k, v in hf_model.state_dict().items()}
        for layer in self.softmax_layers(cfg.is_linear_attention):
            if adapter.query_norm(layers[layer]) is not None:
                raise UserInputError(
                    "this family normalises each head's query (a query norm): a temperature cannot be baked into "
                    "the weights; apply it with export_to_hf(hf_model) hooks instead"
                )
            projection = adapter.query_projection(layers[layer])
            rows = self.layer_scales(layer, n_heads).repeat_interleave(projection.out_features // n_heads)
            fused = _fused_rows(projection)
            if fused is not None:  # scale the query rows of the fused projection, leave k / v
                projection, (start, stop) = fused[0], fused[1:]
                rows = torch.cat([torch.ones(start), rows, torch.ones(int(projection.out_features) - stop)])
            name = by_id[id(projection)]
            for part in ("weight", "bias"):
                key = f"{name}.{part}"
                if key in state:
                    value = state[key]
                    shape = (-1,) + (1,) * (value.ndim - 1)
                    state[key] = (value.float() * rows.view(shape)).to(value.dtype).contiguous()
        return state

    # ------------------------------------------------------------------ I/O
    def to_dict(self) -> dict:
        floored = set(self.floored())
        return {
            "alpha": self.alpha,
            "normalisation": self.normalisation,
            "floor": self.floor,
            "heads": [
                {"layer": layer, "head": head, "beta": b, "gamma": self.gammas.get((layer, head)),
                 "changed": abs(b - 1.0) > 1e-12, "logit_change": b - 1.0, "floored": (layer, head) in floored}
                for (layer, head), b in sorted(self.betas.items())
            ],
            "changed_heads": [list(h) for h in self.changed()],
            "unchanged_heads": [list(h) for h in self.unchanged()],
            "n_changed": len(self.changed()),
            "source": self.source,
        }

    def plot(self, title: str = "Head temperature: beta per head (1 = unchanged)"):
        """Layer x head heatmap of beta (1 for the heads left alone)."""
        n_layers = max(self.layers) + 1
        n_heads = max(head for _, head in self.betas) + 1
        grid = torch.stack([self.layer_scales(layer, n_heads) for layer in range(n_layers)])
        return layer_head_heatmap(grid, title=title, value_label="beta")

    @classmethod
    def from_dict(cls, data: dict) -> HeadTemperature:
        heads = data["heads"]
        for i, entry in enumerate(heads if isinstance(heads, list) else []):
            for key in ("layer", "head"):  # (the keys its heads are found by: a value of another type is named)
                value = entry.get(key) if isinstance(entry, dict) else None
                if isinstance(entry, dict) and key in entry and (not isinstance(value, int) or isinstance(value, bool)):
                    raise UserInputError(f"the field 'heads[{i}].{key}' must be an integer, got {value!r}")
        listed = {(e["layer"], e["head"]) for e in heads}
        for key in ("changed_heads", "unchanged_heads"):  # written from the heads: one they name is one removed
            lost = [f"L{h[0]}H{h[1]}" for h in data.get(key) or [] if isinstance(h, list) and tuple(h) not in listed]
            if lost:
                raise UserInputError(f"the field 'heads' lacks {', '.join(lost)}, which {key!r} names: an entry was "
                                     "removed (the file was edited or cut short)")
        return cls(
            betas={(e["layer"], e["head"]): e["beta"] for e in heads},
            alpha=data.get("alpha", 1.2),
            gammas={(e["layer"], e["head"]): e["gamma"] for e in heads if e.get("gamma") is not None},
            normalisation=data.get("normalisation", "max"),
            floor=data.get("floor", 1.0),
            source=data.get("source", {}),
        )


class EvalFigures(TypedDict):
    """An evaluation's figures as a temperature comparison records them (checked when a file is read)."""

    accuracy: float
    mae: float | None  # (None: a task that is not counting)
    n: int


@dataclass
class TemperatureComparison(Result):
    """What `vlens temperature apply` measured: the temperatures and the evaluation without and
    with them (each {"accuracy", "mae", "n"}; mae None for a task that is not counting)."""

    temperature: HeadTemperature
    without: EvalFigures
    with_temperature: EvalFigures

    kind: ClassVar[str] = "temperature_comparison"

    def to_dict(self) -> dict:
        return {"temperature": self.temperature.to_dict(), "without": dict(self.without),
                "with": dict(self.with_temperature)}

    def saved_key(self, name: str) -> str:
        """The key of results.json that field `name` is saved under (`with_temperature`: "with")."""
        return "with" if name == "with_temperature" else name

    @classmethod
    def from_dict(cls, data: dict) -> TemperatureComparison:
        return cls(temperature=HeadTemperature.from_dict(data["temperature"]),
                   without=cast(EvalFigures, dict(data["without"])), with_temperature=cast(EvalFigures, dict(data["with"])))

    def plot(self, title: str = "Accuracy without and with the head temperatures"):
        """Bars: accuracy without and with the temperatures."""
        go = require_plotly()
        figure = go.Figure(go.Bar(x=["without", "with"],
                                  y=[self.without["accuracy"], self.with_temperature["accuracy"]]))
        return figure.update_layout(title=title, yaxis={"title": "accuracy", "range": [0, 1.05]})


class TemperatureHandle:
    """Removes the hooks it holds; also a context manager (removed on exit)."""

    def __init__(self, remover, handles):
        self._remover, self._handles = remover, handles

    def remove(self) -> None:
        if self._handles:
            self._remover(self._handles)
            self._handles = []

    @property
    def active(self) -> bool:
        return bool(self._handles)

    def __enter__(self) -> TemperatureHandle:
        return self

    def __exit__(self, *exc) -> None:
        self.remove()


def _remove_lens_handles(handles) -> None:
    for hook_point, handle in handles:
        handle.hook.remove()
        hook_point.fwd_hooks = [h for h in hook_point.fwd_hooks if h is not handle]


def _scale_normed(scales: Tensor, head_axis: int = -2):
    def hook(module, args, output: Tensor) -> Tensor:
        shape = [1] * output.ndim
        shape[head_axis] = -1  # [..., n_heads, d_head] (axis -2) or [batch, n_heads, pos, d_head] (axis 1)
        return output * scales.to(output.device, output.dtype).view(shape)

    return hook


def _fused_rows(projection: Any) -> tuple[nn.Linear, int, int] | None:
    """(fused layer, start, stop) where a query projection is a row view of a fused qkv projection (Phi-4-multimodal's
    `RowSlice`), else None."""
    fused = getattr(projection, "fused", None)
    if not isinstance(fused, nn.Linear):
        return None
    return fused, int(projection.start), int(projection.stop)


def _scale_projected(scales: Tensor, n_heads: int, span: tuple[int, int] | None = None):
    """A forward hook scaling each head's query; span: the query's (start, stop) features of a fused output."""
    def scaled(query: Tensor) -> Tensor:
        shape = query.shape
        per_head = query.reshape(*shape[:-1], n_heads, shape[-1] // n_heads)
        return (per_head * scales.to(query.device, query.dtype)[:, None]).view(shape)

    def hook(module, args, output: Tensor) -> Tensor:
        if span is None:
            return scaled(output)
        start, stop = span
        return torch.cat([output[..., :start], scaled(output[..., start:stop]), output[..., stop:]], dim=-1)

    return hook


# ---------------------------------------------------------------------- importance -> gamma


def importance_from_result(
    result, task: str | None = None, metric: str | None = None, n_layers: int | None = None
) -> Float[Tensor, "n_layers n_heads"]:
    """Head importance [n_layers, n_heads] from an ablation or patching result.

    Accepts a `HeadAblation` / `AblationReport` / `PatchingResult` (layer-head), their JSON
    (dict or file path), a {"scores": [[...]]} dict, or a tensor. Ablation: the answer
    log-prob drop (metric="accuracy" for the accuracy drop); an `AblationReport` needs `task`
    when it holds several. Patching: the metric (default "overwrite_rate") per layer and head,
    rows placed at their layer numbers (unpatched layers 0; give n_layers to pad).
    """
    if isinstance(result, Tensor):
        return result.double()
    if isinstance(result, (str, Path)):
        try:
            return importance_from_result(_read_result_file(Path(result)), task, metric, n_layers)
        except UserInputError as err:  # name the file the user gave
            raise UserInputError(f"{result}: {err}") from None
    if hasattr(result, "to_dict") and hasattr(result, "results"):  # AblationReport
        result = result.to_dict()
    elif hasattr(result, "logprob_drop"):  # HeadAblation
        drop = (result.accuracy_drop if metric == "accuracy" else result.logprob_drop).double()
        return _zero_missing_heads(drop, getattr(result, "heads_per_layer", None))
    elif hasattr(result, "metrics") and hasattr(result, "mode"):  # PatchingResult
        result = result.to_dict()
    if not isinstance(result, dict):
        raise UserInputError(f"cannot read head importance from a {type(result).__name__}")
    if "results" in result:  # AblationReport JSON
        tasks = list(result["results"])
        if task is None and len(tasks) != 1:
            raise UserInputError(f"the ablation report has tasks {tasks}: pass task=... (--task on the command "
                                 "line) to pick one")
        if task is not None and task not in result["results"]:
            raise UserInputError(f"task {task!r} is not in the ablation report ({tasks})")
        result = result["results"][task or tasks[0]]
    if "ablated_logprob" in result:  # HeadAblation JSON (null: NaN, a head not measured or not finite)
        clean, ablated = ("clean_accuracy", "ablated_accuracy") if metric == "accuracy" else \
            ("clean_logprob", "ablated_logprob")
        drop = _nan_if_none(result[clean]) - torch.tensor(_nan_if_none(result[ablated]), dtype=torch.float64)
        return _zero_missing_heads(drop, result.get("heads_per_layer"))
    if result.get("mode") == "layer-head":  # PatchingResult JSON
        name = metric or "overwrite_rate"
        floor = result.get("patch_effect_floor")
        if name == "patch_effect" and isinstance(floor, dict) and floor.get("defined") is False:
            raise UserInputError(f"the patching result's patch effect is undefined ({floor.get('rule', 'noise floor')}: "
                                 f"denominator {floor.get('denominator')}); use --metric overwrite_rate or logit_diff")
        if name not in result:
            raise UserInputError(f"the patching result has no metric {name!r}; choose one of "
                                 f"{sorted(k for k in result if isinstance(result[k], list) and k not in ('layers', 'heads', 'pair_ids'))}")
        values = torch.tensor(
            [[float("nan") if v is None else v for v in row] for row in result[name]], dtype=torch.float64
        )
        layers = result["layers"]
        heads = [int(str(cell).lstrip("H")) for cell in result["heads"]]
        out = torch.zeros(max(n_layers or 0, max(layers) + 1), max(heads) + 1, dtype=torch.float64)
        for i, layer in enumerate(layers):  # unpatched layers stay 0; NaN cells of the result stay NaN
            out[layer, heads] = values[i]
        return out
    if "scores" in result:
        return torch.tensor(result["scores"], dtype=torch.float64)
    if "mode" in result:
        raise UserInputError(
            f"a patching result of mode {result['mode']!r} has no per-head scores; "
            "use a layer-head sweep (patch_layer_head)"
        )
    raise UserInputError(
        "unrecognised importance result: expected an ablation report / head ablation, "
        "a layer-head patching result, or {'scores': [[...]]}"
    )


def _zero_missing_heads(importance: Tensor, heads_per_layer: Sequence[int] | None) -> Tensor:
    """Importance 0 (never selected, not "non-finite") in the cells beyond a layer's own heads, where
    layers differ (a hybrid decoder's ablation grid is as wide as its widest layer)."""
    if not heads_per_layer:
        return importance
    importance = importance.clone()
    for layer, heads in enumerate(heads_per_layer):
        importance[layer, heads:] = 0.0
    return importance


def _read_result_file(path: Path) -> dict:
    try:
        return loads_strict(path.read_text(encoding="utf-8"), str(path))
    except FileNotFoundError:
        raise UserInputError("no such result file") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise UserInputError(f"not a JSON result file ({err})") from None


def _nan_if_none(value):
    if isinstance(value, list):
        return [_nan_if_none(v) for v in value]
    return float("nan") if value is None else value


def taxonomy_heads(result, classes: Sequence[str] = TEMPERATURE_CLASSES, stable_only: bool = False) -> list[Head]:
    """The heads of some HeadLens classes (default the paper's targets: cross-modal routing and
    counting aggregation heads), from a `vlens headlens` result: its results.json (path, folder or
    dict) or a taxonomy object with `to_dict()`. stable_only: only heads whose class held on the
    bootstrap resamples of the examples ("stable" in the result)."""
    if isinstance(result, (str, Path)):
        path = Path(result)
        try:
            result = _read_result_file(path / "results.json" if path.is_dir() else path)
        except UserInputError as err:
            raise UserInputError(f"{path}: {err}") from None
    elif hasattr(result, "to_dict"):
        result = result.to_dict()
    entries = result.get("heads") if isinstance(result, dict) else None
    if not isinstance(entries, list) or not all(isinstance(e, dict) and "class" in e for e in entries):
        raise UserInputError("not a HeadLens taxonomy: expected the results.json of `vlens headlens` (heads with a "
                             "'class' each)")
    known = sorted({e["class"] for e in entries} | set(TEMPERATURE_CLASSES))
    unknown = [c for c in classes if c not in known]
    if unknown:
        raise UserInputError(f"unknown head classes {unknown}; the taxonomy's classes: {known}")
    return [(int(e["layer"]), int(e["head"])) for e in entries
            if e["class"] in classes and (not stable_only or e.get("stable", True))]


def fit_temperature(
    importance: Float[Tensor, "n_layers n_heads"] | None,
    heads: Sequence[Head] | None = None,
    top_k: int | None = 8,
    alpha: float = 1.2,
    normalisation: str = "max",
    floor: float | None = 1.0,
    layers: Sequence[int] | None = None,
    source: dict | None = None,
) -> HeadTemperature:
    """betas from importance: the `heads` given (e.g. `taxonomy_heads`: the routing and aggregation
    heads), else the `top_k` most important heads (only heads with positive importance; optionally
    only in `layers`). See the module docstring.

    importance None (only with `heads`): every head gets gamma = 1, beta = alpha. A given head whose
    importance is not positive gets gamma <= 0: the floor leaves it unchanged (reported by
    `HeadTemperature.unchanged`), and without a floor it is refused.
    """
    if importance is None:
        if heads is None:
            raise UserInputError("fit_temperature without importance needs heads=... (e.g. taxonomy_heads(...))")
        if not heads:
            raise UserInputError("no head selected: the taxonomy has no head of the classes asked for")
        alpha = check_float(alpha, "alpha", min=0, min_open=True)
        chosen = sorted({(int(layer), int(head)) for layer, head in heads})
        return HeadTemperature(betas=dict.fromkeys(chosen, alpha), alpha=alpha, gammas=dict.fromkeys(chosen, 1.0),
                               normalisation="none", floor=floor, source=source or {})
    importance = torch.as_tensor(importance, dtype=torch.float64)
    if importance.ndim != 2:
        raise UserInputError(f"importance must be [n_layers, n_heads], got shape {tuple(importance.shape)}")
    if normalisation not in NORMALISATIONS:
        raise UserInputError(f"normalisation must be one of {NORMALISATIONS}, got {normalisation!r}")
    alpha = check_float(alpha, "alpha", min=0, min_open=True)
    if floor is not None:
        floor = check_float(floor, "floor", min=0, min_open=True)
    if top_k is not None:
        top_k = check_count(top_k, "top_k")
    if heads is not None:  # a head outside the grid would be an IndexError (or a negative index: the wrong head)
        n_layers, n_heads = importance.shape
        outside = [f"L{layer}H{head}" for layer, head in heads
                   if not (0 <= int(layer) < n_layers and 0 <= int(head) < n_heads)]
        if outside:
            raise UserInputError(f"heads {', '.join(outside)} do not exist: the importance covers {n_layers} layers x "
                                 f"{n_heads} heads (L0H0 .. L{n_layers - 1}H{n_heads - 1})")
    broken = [(layer, head) for layer, head in (~torch.isfinite(importance)).nonzero().tolist()]
    if heads is not None:
        bad = [head for head in heads if tuple(head) in set(broken)]
        if bad:
            raise UserInputError(f"the importance of heads {bad} is NaN/inf (their result was not finite); "
                                 "choose other heads or recompute the result")
    elif broken:
        warn_non_finite("temperature fit", f"the importance of heads {broken[:6]}"
                        + (f" (+{len(broken) - 6} more)" if len(broken) > 6 else "") + ", never selected")
    if heads is None:
        candidates = [
            (float(importance[layer, head]), layer, head)
            for layer in range(importance.shape[0])
            for head in range(importance.shape[1])
            if (layers is None or layer in layers) and float(importance[layer, head]) > 0
            and math.isfinite(float(importance[layer, head]))
        ]
        candidates.sort(key=lambda c: (-c[0], c[1], c[2]))
        heads = [(layer, head) for _, layer, head in candidates[:top_k]]
    heads = [(int(layer), int(head)) for layer, head in heads]
    if not heads:
        raise UserInputError("no head selected: the importance has no positive entry (check the result / metric)")
    values = torch.tensor([float(importance[layer, head]) for layer, head in heads], dtype=torch.float64)
    if normalisation == "max":
        denominator = values.abs().max()
    elif normalisation == "mean":
        denominator = values.mean()
    else:
        denominator = torch.tensor(1.0, dtype=torch.float64)
    if not denominator > 0:
        raise UserInputError(f"cannot normalise importance by {normalisation}: it is {float(denominator)}")
    gammas = {head: float(v / denominator) for head, v in zip(heads, values, strict=True)}
    if floor is None and any(g <= 0 for g in gammas.values()):
        weak = [f"L{a}H{b}" for (a, b), g in gammas.items() if g <= 0]
        raise UserInputError(f"heads {weak} have no positive importance, so beta = alpha * gamma would be <= 0: keep "
                             "the floor (they are then left unchanged) or choose other heads")
    betas = {head: max(floor, alpha * g) if floor is not None else alpha * g for head, g in gammas.items()}
    return HeadTemperature(
        betas=betas, alpha=alpha, gammas=gammas, normalisation=normalisation, floor=floor, source=source or {}
    )

"""Patching metrics: the answer metrics at the final prompt position (the default), or any callable.

A sweep reads the logits at its readout positions (default: the final prompt position) and
hands them to its metric, TransformerLens style: ``metric(logits [n_pairs, n_readout, d_vocab])
-> [n_pairs]`` (averaged over pairs), a number, or a dict of those. `AnswerMetrics` is the
default; any other callable is wrapped in `MetricFunction`.

Definitions (per pair i, with clean answer token c_i and corrupt answer token k_i; "prediction"
is the argmax token at the final position):

- logit difference: LD = logit[k_i] - logit[c_i] (corrupt answer minus clean answer).
- overwrite: the clean run predicts c_i and the patched run predicts k_i (the prediction flips
  from the clean answer to the corrupted answer). Overwrite rate = share of all pairs.
- flip-away: the clean run predicts c_i and the patched run predicts anything else.
- corrupt-answer rate: the patched run predicts k_i, whatever the clean run predicted (equal to
  the overwrite rate when the model gets every clean prompt right).
- normalised patch effect: (LD_patched - LD_clean) / (LD_corrupt - LD_clean), on the pair
  means of LD: 0 = no effect, 1 = the patched run is as "corrupt" as the corrupt run. Its
  denominator is guarded by a noise floor (`effect_floor`): when the mean clean-corrupt
  difference is within 2 standard errors of 0 over the pairs, or within 16 steps of the logits'
  dtype resolution at their magnitude, the effect is NaN (null in JSON) rather than a ratio of noise.

Direction ("noising", the default, or "denoising"; `vlens.patching.sweeps`): the metrics are
always read on the run that *receives* the patch ("base") against the run the activation comes
from ("source"). Noising: base = clean, source = corrupt, as above. Denoising swaps the roles
(`PairBatch.swapped`): LD = logit[clean answer] - logit[corrupt answer], the overwrite rate is the
share of pairs whose corrupt run answers the corrupt count and whose patched run answers the clean
one, and the patch effect is the share of the clean-corrupt difference restored (TransformerLens's
normalised metric for `get_act_patch_*`, which patch clean into corrupt).

Non-finite logits (a NaN activation) are never turned into predictions: such a pair's logit
difference is NaN, its prediction -1, and every rate over it NaN (see `vlens.utils.finite`).
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from jaxtyping import Float, Int
from torch import Tensor

from vlens.utils.errors import UserInputError
from vlens.utils.finite import finite_rows
from vlens.utils.noise_floor import (  # noqa: F401  (NoiseFloorWarning: re-exported)
    FLOOR_RESOLUTION_STEPS,
    FLOOR_STANDARD_ERRORS,
    NoiseFloorWarning,
    noise_floor,
)

if TYPE_CHECKING:
    from vlens.patching.pairs import PairBatch

METRICS: tuple[str, ...] = ("overwrite_rate", "flip_away_rate", "logit_diff", "patch_effect", "corrupt_answer_rate")


@dataclass
class EffectFloor:
    """The patch effect's denominator and the noise floor it is checked against.

    denominator: mean over pairs of LD_corrupt - LD_clean; standard_error: its standard error
    over pairs (NaN for one pair); resolution: eps(dtype) * mean over pairs and both runs of
    the largest |logit| of the row (one step of the dtype at the logits' magnitude);
    floor = max(2 * standard_error, 16 * resolution). `defined` is |denominator| > floor.
    """

    denominator: float
    standard_error: float
    resolution: float
    dtype: str
    n_pairs: int

    @property
    def floor(self) -> float:
        return noise_floor(self.standard_error, self.resolution)  # the rule every normalised score shares

    @property
    def defined(self) -> bool:
        return math.isfinite(self.denominator) and abs(self.denominator) > self.floor

    def to_dict(self) -> dict:
        return {"denominator": self.denominator, "standard_error": self.standard_error,
                "resolution": self.resolution, "dtype": self.dtype, "n_pairs": self.n_pairs, "floor": self.floor,
                "defined": self.defined,
                "rule": f"NaN unless |mean(LD_corrupt - LD_clean)| > max({FLOOR_STANDARD_ERRORS:g} standard errors "
                        f"over pairs, {FLOOR_RESOLUTION_STEPS} * eps(dtype) * mean max|logit|)"}

    def describe(self) -> str:
        return (f"mean clean-corrupt logit difference {self.denominator:.3g} over {self.n_pairs} pairs is within the "
                f"noise floor {self.floor:.3g} (standard error {self.standard_error:.3g}, {self.dtype} resolution "
                f"{self.resolution:.3g} per logit)")


def _resolution(logits: Tensor, dtype: torch.dtype) -> Tensor:
    """eps(dtype) * the largest |logit| of each row ([n_pairs]; NaN where the row is not finite)."""
    eps = torch.finfo(dtype).eps if dtype.is_floating_point else 0.0
    return eps * logits.detach().float().abs().amax(-1).cpu().masked_fill(~finite_rows(logits).cpu(), torch.nan)


def _floor_parts(difference: Float[Tensor, "n_pairs"], ok: Tensor, resolution: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Per condition (ok: bool [..., n_pairs]): mean difference, its standard error, mean resolution."""
    weight = ok.double()
    n = weight.sum(-1)
    d = difference.double().nan_to_num(0.0)
    mean = (d * weight).sum(-1) / n.clamp_min(1)
    variance = (((d - mean[..., None]) ** 2) * weight).sum(-1) / (n - 1).clamp_min(1)
    standard_error = torch.where(n > 1, (variance / n.clamp_min(1)).sqrt(), torch.nan)
    res = (resolution.double().nan_to_num(0.0) * weight).sum(-1) / n.clamp_min(1)
    return torch.where(n > 0, mean, torch.nan), standard_error, res


def effect_floor(baseline: Baseline, ok: Tensor | None = None) -> EffectFloor:
    """The noise floor of the patch effect over the pairs `ok` (bool [n_pairs], default all finite)."""
    ok = baseline.finite if ok is None else ok.cpu() & baseline.finite
    mean, standard_error, resolution = _floor_parts(baseline.corrupt_logit_diff.cpu() - baseline.clean_logit_diff.cpu(),
                                                    ok, baseline.resolution)
    return EffectFloor(float(mean), float(standard_error), float(resolution),
                       str(baseline.resolution_dtype).replace("torch.", ""), int(ok.sum()))


def logit_diff(logits: Float[Tensor, "... n_pairs d_vocab"], clean_tokens: Int[Tensor, "n_pairs"],
               corrupt_tokens: Int[Tensor, "n_pairs"]) -> Float[Tensor, "... n_pairs"]:
    """logit[corrupt answer] - logit[clean answer], per pair (leading condition dims kept)."""
    clean_tokens, corrupt_tokens = clean_tokens.to(logits.device), corrupt_tokens.to(logits.device)
    index = torch.stack([corrupt_tokens, clean_tokens], dim=-1).expand(*logits.shape[:-1], 2)
    picked = logits.gather(-1, index)
    return picked[..., 0] - picked[..., 1]


@dataclass
class SavedBaseline:
    """A `Baseline` read back from a saved result: the per-pair values results use ([n_pairs] each;
    the logits themselves are not saved)."""

    clean_logit_diff: Float[Tensor, "n_pairs"]
    corrupt_logit_diff: Float[Tensor, "n_pairs"]
    finite: Tensor
    clean_correct: Tensor
    corrupt_correct: Tensor
    clean_tokens: Int[Tensor, "n_pairs"]
    corrupt_tokens: Int[Tensor, "n_pairs"]


@dataclass
class Baseline:
    """The unpatched runs: per-pair final-position logits of the clean and corrupt inputs."""

    clean_logits: Float[Tensor, "n_pairs d_vocab"]
    corrupt_logits: Float[Tensor, "n_pairs d_vocab"]
    clean_tokens: Int[Tensor, "n_pairs"]
    corrupt_tokens: Int[Tensor, "n_pairs"]
    dtype: torch.dtype | None = None  # the model's compute dtype (default: the logits')

    @property
    def resolution_dtype(self) -> torch.dtype:
        """The coarser of the model's dtype and the logits' dtype: the resolution the logits were computed at."""
        dtypes = [d for d in (self.dtype, self.clean_logits.dtype) if d is not None and d.is_floating_point]
        return max(dtypes, key=lambda d: torch.finfo(d).eps) if dtypes else torch.float32

    @property
    def resolution(self) -> Float[Tensor, "n_pairs"]:
        """Per pair, one step of the dtype at the logits' magnitude (mean of the clean and corrupt runs)."""
        dtype = self.resolution_dtype
        return (_resolution(self.clean_logits, dtype) + _resolution(self.corrupt_logits, dtype)) / 2

    @property
    def clean_logit_diff(self) -> Float[Tensor, "n_pairs"]:
        """NaN for pairs whose clean logits are not finite."""
        values = logit_diff(self.clean_logits, self.clean_tokens, self.corrupt_tokens)
        return values.masked_fill(~finite_rows(self.clean_logits), torch.nan)

    @property
    def corrupt_logit_diff(self) -> Float[Tensor, "n_pairs"]:
        """NaN for pairs whose corrupt logits are not finite."""
        values = logit_diff(self.corrupt_logits, self.clean_tokens, self.corrupt_tokens)
        return values.masked_fill(~finite_rows(self.corrupt_logits), torch.nan)

    @property
    def finite(self) -> Tensor:
        """bool [n_pairs]: both unpatched runs gave finite logits."""
        return (finite_rows(self.clean_logits) & finite_rows(self.corrupt_logits)).cpu()

    @property
    def clean_correct(self) -> Tensor:
        """bool [n_pairs]: the clean run predicts the clean answer (False where its logits are not finite)."""
        return (self.clean_logits.argmax(-1).cpu() == self.clean_tokens.cpu()) & finite_rows(self.clean_logits).cpu()

    @property
    def corrupt_correct(self) -> Tensor:
        """bool [n_pairs]: the corrupt run predicts the corrupt answer (False where its logits are not finite)."""
        return ((self.corrupt_logits.argmax(-1).cpu() == self.corrupt_tokens.cpu())
                & finite_rows(self.corrupt_logits).cpu())


def final_baseline(batch: PairBatch, clean: Float[Tensor, "n_pairs 1 d_vocab"],
                   corrupt: Float[Tensor, "n_pairs 1 d_vocab"]) -> Baseline:
    """The answer metrics' `Baseline` from unpatched logits read at the final position."""
    return Baseline(clean[:, -1], corrupt[:, -1], batch.clean_tokens, batch.corrupt_tokens)


def reduce_patched(patched_logits: Float[Tensor, "... n_pairs d_vocab"], clean_tokens: Int[Tensor, "n_pairs"],
                   corrupt_tokens: Int[Tensor, "n_pairs"]) -> tuple[Float[Tensor, "... n_pairs"], Int[Tensor, "... n_pairs"]]:
    """What the metrics read of patched logits: (per-pair logit difference, argmax token), on CPU.

    Elementwise per pair, so reducing chunks of conditions or pairs separately gives the same values.
    """
    patched_logits = patched_logits.float().cpu()
    ok = finite_rows(patched_logits)  # non-finite logits: NaN difference, prediction -1
    per_pair = logit_diff(patched_logits, clean_tokens.cpu(), corrupt_tokens.cpu()).masked_fill(~ok, torch.nan)
    return per_pair, patched_logits.argmax(-1).masked_fill(~ok, -1)


def patch_metrics(patched_logits: Float[Tensor, "... n_pairs d_vocab"], baseline: Baseline) -> dict[str, Tensor]:
    """All metrics for patched final-position logits; each is [...] (leading condition dims).

    Also returns "per_pair_logit_diff" and "per_pair_prediction" (argmax token), both [..., n_pairs].
    """
    per_pair, prediction = reduce_patched(patched_logits, baseline.clean_tokens, baseline.corrupt_tokens)
    return metrics_from_reduced(per_pair, prediction, baseline)


def metrics_from_reduced(per_pair: Float[Tensor, "... n_pairs"], prediction: Int[Tensor, "... n_pairs"],
                         baseline: Baseline) -> dict[str, Tensor]:
    """`patch_metrics` from `reduce_patched`'s output (per-pair logit difference and argmax token)."""
    clean_tokens, corrupt_tokens = baseline.clean_tokens.cpu(), baseline.corrupt_tokens.cpu()
    # a pair is undefined where its patched (prediction -1), clean or corrupt logits are not all finite
    ok = (prediction >= 0) & baseline.finite
    clean_correct = baseline.clean_correct

    def rate(hit: Tensor) -> Tensor:
        return torch.where(ok, hit.float(), torch.nan).mean(-1)

    overwrite = clean_correct & (prediction == corrupt_tokens)
    flip_away = clean_correct & (prediction != clean_tokens)
    per_pair, prediction = per_pair.masked_fill(~ok, torch.nan), prediction.masked_fill(~ok, -1)
    effect = patch_effect_of(per_pair, baseline, ok)
    return {
        "overwrite_rate": rate(overwrite),
        "flip_away_rate": rate(flip_away),
        "logit_diff": per_pair.mean(-1),
        "patch_effect": effect,
        "corrupt_answer_rate": rate(prediction == corrupt_tokens),
        "per_pair_logit_diff": per_pair,
        "per_pair_prediction": prediction,
    }


def patch_effect_of(per_pair: Float[Tensor, "... n_pairs"], baseline: Baseline, ok: Tensor | None = None,
                    ) -> Float[Tensor, "..."]:
    """The normalised patch effect per condition, on the pairs `ok` of each ([..., n_pairs], default:
    the finite ones): mean(LD_patched - LD_clean) / mean(LD_corrupt - LD_clean); NaN where that
    denominator is within the noise floor (`effect_floor`)."""
    clean = baseline.clean_logit_diff.double().cpu()
    difference = baseline.corrupt_logit_diff.double().cpu() - clean
    ok = (per_pair.isfinite() if ok is None else ok.cpu()) & baseline.finite & per_pair.isfinite()
    denominator, standard_error, resolution = _floor_parts(difference, ok, baseline.resolution)
    floor = torch.maximum(FLOOR_STANDARD_ERRORS * standard_error.nan_to_num(0.0), FLOOR_RESOLUTION_STEPS * resolution)
    weight = ok.double()
    numerator = ((per_pair.double() - clean).nan_to_num(0.0) * weight).sum(-1) / weight.sum(-1).clamp_min(1)
    effect = numerator / denominator
    return torch.where(denominator.abs() > floor, effect, torch.nan).float()


# ---------------------------------------------------------------------- metric callables
# A patching metric, TransformerLens style: logits at the readout positions -> one value per pair
# (or one number for the batch), or a dict of such values under names.
MetricFn = Callable[[Tensor], Tensor | Mapping[str, Tensor]]


class AnswerMetrics:
    """The default metric of every sweep: the answer metrics of `METRICS` at the final position.

    Per condition it keeps what those metrics read (per pair: the logit difference of
    the corrupt vs the clean answer token, and the argmax token); `summarize` turns them, with
    the unpatched runs, into overwrite rate, flip-away rate, logit difference, normalised patch
    effect and corrupt-answer rate. The answer tokens are the pair batch's (`vlens.core.answers`).
    """

    names: tuple[str, ...] = METRICS

    def __init__(self, clean_tokens: Int[Tensor, "n_pairs"], corrupt_tokens: Int[Tensor, "n_pairs"],
                 dtype: torch.dtype | None = None):
        self.clean_tokens, self.corrupt_tokens = clean_tokens, corrupt_tokens
        self.dtype = dtype  # the model's compute dtype, for the patch effect's noise floor

    def subset(self, rows: Sequence[int]) -> AnswerMetrics:
        """The same metric for some of the pairs (a pair chunk)."""
        return AnswerMetrics(self.clean_tokens[list(rows)], self.corrupt_tokens[list(rows)], self.dtype)

    def __call__(self, logits: Float[Tensor, "n_pairs n_readout d_vocab"]) -> dict[str, Tensor]:
        if logits.shape[-2] != 1:
            raise UserInputError("the answer metrics read one position (readout='final'); pass metric=... to "
                                 "score several readout positions")
        per_pair, prediction = reduce_patched(logits[..., -1, :], self.clean_tokens, self.corrupt_tokens)
        return {"logit_diff": per_pair, "prediction": prediction}

    def summarize(self, values: Mapping[str, Tensor], clean: Tensor, corrupt: Tensor) -> Summary:
        """values: name -> [n_specs, n_pairs]; clean / corrupt: unpatched readout logits [n_pairs, 1, d_vocab]."""
        baseline = Baseline(clean[:, -1], corrupt[:, -1], self.clean_tokens, self.corrupt_tokens, self.dtype)
        reduced = metrics_from_reduced(values["logit_diff"], values["prediction"], baseline)
        per_pair = {"logit_diff": reduced.pop("per_pair_logit_diff"), "prediction": reduced.pop("per_pair_prediction")}
        return Summary(metrics=reduced, per_pair=per_pair, baseline=baseline)


class MetricFunction:
    """A user metric ``fn(logits [n_pairs, n_readout, d_vocab]) -> [n_pairs] | scalar | {name: ...}``.

    Each name's value is averaged over pairs (a scalar is kept as is, and then the pairs must
    run in one chunk); the unpatched runs' values are kept as the baseline. A metric that needs
    per-pair data (answer tokens, ...) takes ``fn(logits, rows)``: `rows` are the batch indices
    of the pairs in `logits`, so it stays right when the sweep runs the pairs in chunks.
    """

    def __init__(self, fn: MetricFn, name: str | None = None, rows: Sequence[int] | None = None):
        if not callable(fn):
            raise UserInputError(f"metric must be callable (logits -> values), got {type(fn).__name__}")
        self.fn = fn
        label = name or str(getattr(fn, "__name__", "metric"))
        self.name: str = "metric" if label == "<lambda>" else label
        self.rows = None if rows is None else torch.as_tensor(list(rows), dtype=torch.long)
        self.takes_rows = _positional_arity(fn) >= 2

    def subset(self, rows: Sequence[int]) -> MetricFunction:
        """The metric for a chunk of pairs (a metric without a `rows` argument sees no difference)."""
        return MetricFunction(self.fn, self.name, rows)

    def raw(self, logits: Float[Tensor, "n_pairs n_readout d_vocab"]) -> Tensor | Mapping[str, Tensor]:
        """What the function returns (gradients kept, for attribution patching)."""
        if self.takes_rows:
            rows = torch.arange(logits.shape[0]) if self.rows is None else self.rows
            return self.fn(logits, rows)  # type: ignore[call-arg]
        return self.fn(logits)

    def __call__(self, logits: Float[Tensor, "n_pairs n_readout d_vocab"]) -> dict[str, Tensor]:
        out = self.raw(logits)
        named = dict(out) if isinstance(out, Mapping) else {self.name: out}
        values = {}
        for key, value in named.items():
            value = torch.as_tensor(value).detach().float().cpu()
            if value.shape not in ((), (logits.shape[0],)):
                raise UserInputError(f"metric {key!r} returned shape {tuple(value.shape)}: return one value per pair "
                                     f"[{logits.shape[0]}] or one number")
            values[str(key)] = value
        return values

    @property
    def names(self) -> tuple[str, ...]:
        return ()  # known once the metric has run (a dict metric names its own values)

    def summarize(self, values: Mapping[str, Tensor], clean: Tensor, corrupt: Tensor) -> Summary:
        metrics = {k: v.mean(-1) if v.ndim == 2 else v for k, v in values.items()}
        per_pair = {k: v for k, v in values.items() if v.ndim == 2}
        unpatched = {"clean": self(clean), "corrupt": self(corrupt)}
        return Summary(metrics=metrics, per_pair=per_pair, baseline=None,
                       baseline_values={k: {role: unpatched[role][k] for role in unpatched} for k in values})


def _positional_arity(fn: Callable) -> int:
    """How many positional arguments `fn` takes (2 for ``metric(logits, rows)``)."""
    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # builtins without a signature: called with the logits only
        return 1
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    if any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in parameters):
        return 2
    return sum(p.kind in kinds and p.default is inspect.Parameter.empty for p in parameters)


@dataclass
class Summary:
    """A sweep's metrics (name -> [n_specs]), per-pair values (name -> [n_specs, n_pairs]) and its
    unpatched runs (the answer metrics' `Baseline`, or a user metric's clean / corrupt values)."""

    metrics: dict[str, Tensor]
    per_pair: dict[str, Tensor]
    baseline: Baseline | None
    baseline_values: dict[str, dict[str, Tensor]] | None = None


def as_metric(metric: MetricFn | AnswerMetrics | MetricFunction | None, batch: PairBatch,
              dtype: torch.dtype | None = None) -> AnswerMetrics | MetricFunction:
    """The sweep's metric: the answer metrics of `batch` by default (dtype: the model's, for the
    patch effect's noise floor), else the callable given."""
    if metric is None:
        return AnswerMetrics(batch.clean_tokens, batch.corrupt_tokens, dtype)
    if isinstance(metric, (AnswerMetrics, MetricFunction)):
        return metric
    return MetricFunction(metric)

"""`AblationSettings`: what a cross-task ablation measures (how is `vlens.SweepOptions`).

    report = cross_task_ablation(model, sets, AblationSettings(method="mean", top_k=20))

One frozen object instead of the same seven keywords passed from the study to the method and
on to each sweep; `replace(...)` makes a variant.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from vlens.ablation.hooks import METHODS
from vlens.ablation.reference import ALIGNMENTS
from vlens.ablation.results import RANK_BY
from vlens.utils.errors import UserInputError

REFERENCE_MODES: tuple[str, ...] = ("per-task", "pooled")
UNITS: tuple[str, ...] = ("head", "expert")  # what an ablation removes


@dataclass(frozen=True)
class AblationSettings:
    """How each head is ablated and how the heads of a task are ranked (docs/method.md, section 6).

    Attributes:
        method: "mean" (the reference set's mean output of the head), "zero", or "resample" (a
            seeded reference example's output per evaluation example, aligned like the means).
        alignment: how reference positions are matched to evaluation positions: "all",
            "position" or "region" (`vlens.ablation.reference`).
        reference_mode: "per-task" (each task's own reference set) or "pooled" (every task's
            reference set together, one mean for every task).
        top_k: size of each task's head set.
        rank_by: rank heads by their "logprob" or "accuracy" drop.
        seed: the resampling seed (method "resample").
        retest_seed: the resampling seed of the retest sweep (default `seed`); in
            `vlens.studies.ablation.ablation_study` also the first seed of the retest examples.
        unit: what is ablated, "head" (each attention head's `hook_z`) or "expert" (each expert of
            the mixture-of-experts layers, `vlens.ablation.experts`).
    """

    method: str = "mean"
    alignment: str = "region"
    reference_mode: str = "per-task"
    top_k: int = 20
    rank_by: str = "logprob"
    seed: int = 0
    retest_seed: int | None = None
    unit: str = "head"

    def __post_init__(self) -> None:
        for name, allowed in (("method", METHODS), ("alignment", ALIGNMENTS), ("reference_mode", REFERENCE_MODES),
                              ("rank_by", RANK_BY), ("unit", UNITS)):
            if getattr(self, name) not in allowed:
                raise UserInputError(f"AblationSettings.{name} must be one of {allowed}, got {getattr(self, name)!r}")
        for name in ("top_k", "seed", "retest_seed"):
            value = getattr(self, name)
            if value is None and name == "retest_seed":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < (1 if name == "top_k" else 0):
                raise UserInputError(f"AblationSettings.{name} must be an integer >= {1 if name == 'top_k' else 0}, "
                                     f"got {value!r}")

    def replace(self, **changes: Any) -> AblationSettings:
        """A copy with some fields changed (checked again)."""
        unknown = sorted(set(changes) - {f.name for f in dataclasses.fields(self)})
        if unknown:
            raise UserInputError(f"AblationSettings has no field {', '.join(unknown)}")
        return dataclasses.replace(self, **changes)


def split_legacy(settings: AblationSettings | None, legacy: Mapping[str, Any],
                 where: str) -> tuple[AblationSettings, dict[str, Any]]:
    """(`settings` with old ablation keywords folded in, the keywords left for `SweepOptions`).

    The old keywords (method=, alignment=, top_k=, ...) warn (`DeprecationWarning`); with
    `settings` given too they are refused.
    """
    import warnings

    settings = AblationSettings() if settings is None else settings
    if not isinstance(settings, AblationSettings):
        raise UserInputError(f"{where}: settings must be an AblationSettings, got {type(settings).__name__}")
    names = {f.name for f in dataclasses.fields(AblationSettings)}
    mine = {k: v for k, v in legacy.items() if k in names}
    rest = {k: v for k, v in legacy.items() if k not in names}
    if mine:
        warnings.warn(f"{where}: the keywords {', '.join(f'{k}=' for k in sorted(mine))} moved into "
                      f"settings=AblationSettings(...)", DeprecationWarning, stacklevel=3)
        if settings != AblationSettings():
            raise UserInputError(f"{where}: give the ablation either as settings=AblationSettings(...) or as the old "
                                 f"keywords ({', '.join(sorted(mine))}), not both")
        settings = settings.replace(**mine)
    return settings, rest


__all__ = ["REFERENCE_MODES", "UNITS", "AblationSettings", "split_legacy"]

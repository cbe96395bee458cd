"""`SweepOptions`: how a sweep runs, shared by every method that loops over examples or conditions.

    opts = vlens.SweepOptions(batch_size=8, progress=False, cache_device="cpu")
    patch_layer_head(model, batch, options=opts)
    attribution_patching(model, batch, options=opts)
    cross_task_ablation(model, sets, options=opts)
    logit_lens_records(model, records, options=opts)
    compute_head_scores(model, samples, options=opts)
    evaluate(backend, dataset, options=opts)

One object, one name per meaning: how many examples go through the model together, how many
conditions are stacked into one forward, where the logits are read, whether a bar is shown, how
the work is split across processes and where cached activations live. What an analysis
*measures* (the metric, the component, the ablation method, the answer parser) stays an argument
of the method; what the options change is only how the same numbers are computed, except
`readout`, which methods that can only read the final position refuse to change (a clear
`UserInputError`, never a silent fallback).

Every sweep also takes `options.replace(...)` for a one-off change:
``patch_layer_head(model, batch, options=opts.replace(progress=True))``. The old per-function
keywords (``progress=``, ``sharding=``, ``max_batch=``, ``pair_batch_size=``, ``batch_size=``,
``heads_per_pass=``, ``readout=``, and the patching sweeps' ``method=`` "fast" / "naive") still work for now with a `DeprecationWarning` naming the
field they moved to (`fold_legacy`).
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from vlens.parallel.sharding import Sharding
from vlens.utils.errors import UserInputError

Readout = str | int | Sequence[int]
IMPLEMENTATIONS: tuple[str, ...] = ("fast", "naive")  # of the exact patching sweeps

# old keyword -> the SweepOptions field that replaced it
LEGACY_NAMES: dict[str, str] = {
    "method": "implementation",
    "batch_size": "batch_size",
    "pair_batch_size": "batch_size",
    "max_batch": "max_batch",
    "heads_per_pass": "heads_per_pass",
    "readout": "readout",
    "progress": "progress",
    "sharding": "sharding",
}


@dataclass(frozen=True)
class SweepOptions:
    """How a sweep runs (not what it measures). Every field has the same meaning in every method.

    Attributes:
        batch_size: examples that go through the model together (for patching and attribution
            patching: pairs, each run clean and corrupt); larger is faster and needs more memory.
            The numbers do not depend on it beyond float noise. None: the method's default (all
            pairs at once for patching; 16 examples for ablation; 8 for the lenses, head scores
            and evaluation).
        max_batch: the most rows in one forward when a sweep stacks its conditions as copies of
            the batch (the patching fast path: conditions x pairs).
        heads_per_pass: ablation: heads (experts, for expert ablation) of one layer ablated together,
            each in its own copy of the batch (rows = heads_per_pass x batch_size).
        implementation: how the exact patching sweeps compute their cells: "fast" (the vision
            tower and the clean run once, each condition resumed at its layer, conditions stacked)
            or "naive" (one full hooked forward per cell, the reference); the same numbers within
            float noise.
        readout: where the logits are read: "final" (each row's final prompt position) or
            column indices of the left-padded batch (-1 = the final one). Patching and
            attribution patching read any positions; the logit lens, head scores, ablation and
            evaluation read the answer after the final prompt position and refuse anything else.
        progress: show tqdm bars (only rank 0 of a sharded run shows them).
        sharding: split the work across processes (`vlens.parallel.from_env()` under torchrun);
            every process returns the full result. None: this process only.
        cache_device: where a sweep keeps the activations it caches between forwards (the
            corrupt run and the clean residuals of patching, the corrupt run of attribution
            patching, the clean residuals and reference outputs of ablation, the residuals of
            the logit lens and of lens training). None: where they were computed (lens
            training's residual corpus: the CPU). "cpu" saves accelerator memory on large
            models at the cost of copies; the numbers are the same.
    """

    batch_size: int | None = None
    max_batch: int = 64
    heads_per_pass: int = 8
    implementation: str = "fast"
    readout: Readout = "final"
    progress: bool = True
    sharding: Sharding | None = None
    cache_device: str | torch.device | None = None

    def __post_init__(self) -> None:
        for name in ("batch_size", "max_batch", "heads_per_pass"):
            value = getattr(self, name)
            if value is None and name == "batch_size":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise UserInputError(f"SweepOptions.{name} must be an integer >= 1"
                                     f"{' or None' if name == 'batch_size' else ''}, got {value!r}")
        if self.implementation not in IMPLEMENTATIONS:
            raise UserInputError(f"SweepOptions.implementation must be one of {IMPLEMENTATIONS}, got "
                                 f"{self.implementation!r}")
        readout = self.readout
        if isinstance(readout, str):
            if readout != "final":
                raise UserInputError(f"SweepOptions.readout must be 'final' or column indices, got {readout!r}")
        elif isinstance(readout, int) and not isinstance(readout, bool):
            pass
        elif isinstance(readout, Sequence) and readout and all(isinstance(c, int) and not isinstance(c, bool)
                                                              for c in readout):
            object.__setattr__(self, "readout", tuple(readout))  # frozen: a list could change under us
        else:
            raise UserInputError(f"SweepOptions.readout must be 'final', a column index or a non-empty list of "
                                 f"column indices, got {readout!r}")
        if not isinstance(self.progress, bool):
            raise UserInputError(f"SweepOptions.progress must be True or False, got {self.progress!r}")
        if self.sharding is not None and not isinstance(self.sharding, Sharding):
            raise UserInputError("SweepOptions.sharding must be a vlens.parallel.Sharding (e.g. "
                                 f"vlens.parallel.from_env()), got {type(self.sharding).__name__}")
        if self.cache_device is not None:
            try:
                object.__setattr__(self, "cache_device", torch.device(self.cache_device))
            except (RuntimeError, TypeError) as error:
                raise UserInputError(f"SweepOptions.cache_device {self.cache_device!r} is not a torch device "
                                     f"(e.g. 'cpu', 'cuda:0'): {error}") from None

    def replace(self, **changes: Any) -> SweepOptions:
        """A copy with some fields changed (`dataclasses.replace`, checked again)."""
        unknown = sorted(set(changes) - {f.name for f in dataclasses.fields(self)})
        if unknown:
            raise UserInputError(f"SweepOptions has no field {', '.join(unknown)}; its fields are "
                                 f"{[f.name for f in dataclasses.fields(self)]}")
        return dataclasses.replace(self, **changes)

    def batch(self, default: int) -> int:
        """`batch_size`, or the method's `default` when it is None."""
        return default if self.batch_size is None else self.batch_size

    @property
    def shards(self) -> Sharding:
        """`sharding`, or one process."""
        return self.sharding if self.sharding is not None else Sharding()

    @property
    def shown(self) -> bool:
        """Whether this process shows progress bars (only rank 0 of a sharded run does)."""
        return self.shards.progress(self.progress)

    def keep(self, tensor: torch.Tensor) -> torch.Tensor:
        """`tensor` on `cache_device` (unchanged when it is None)."""
        return tensor if self.cache_device is None else tensor.to(self.cache_device)

    def require_final(self, where: str) -> None:
        """Refuse a `readout` other than "final" in a method that reads only there."""
        if self.readout != "final":
            raise UserInputError(f"{where} reads the answer after each row's final prompt position: "
                                 f"SweepOptions.readout must be 'final', got {self.readout!r} (other readout "
                                 "positions are for patching and attribution patching)")

    def settings(self) -> dict[str, Any]:
        """The fields as plain JSON values (a result records how it was run; sharding as its world size)."""
        return {"batch_size": self.batch_size, "max_batch": self.max_batch, "heads_per_pass": self.heads_per_pass,
                "implementation": self.implementation,
                "readout": self.readout if isinstance(self.readout, str | int) else list(self.readout),
                "world_size": self.shards.world_size,
                "cache_device": None if self.cache_device is None else str(self.cache_device)}


def fold_legacy(options: SweepOptions | None, legacy: Mapping[str, Any], where: str,
                names: Sequence[str] = tuple(LEGACY_NAMES)) -> SweepOptions:
    """`options` (default `SweepOptions()`) with the old keywords `legacy` folded in.

    Each old keyword warns once per call site (`DeprecationWarning`) naming the field that
    replaced it; a keyword the function never took raises `TypeError` as Python would; giving
    both an old keyword and `options` is refused (which one would win is not obvious).
    names: the old keywords this function took (others are not its keywords).
    """
    options = SweepOptions() if options is None else options
    if not isinstance(options, SweepOptions):
        raise UserInputError(f"{where}: options must be a vlens.SweepOptions, got {type(options).__name__}")
    if not legacy:
        return options
    unknown = sorted(set(legacy) - set(names))
    if unknown:
        raise TypeError(f"{where}() got an unexpected keyword argument {unknown[0]!r}")
    changes = {LEGACY_NAMES[name]: value for name, value in legacy.items()}
    if len(changes) < len(legacy):
        raise UserInputError(f"{where}: {' and '.join(sorted(legacy))} mean the same thing "
                             f"(SweepOptions.{next(iter(changes))}); give it once")
    spelled = ", ".join(f"{name}= -> SweepOptions({LEGACY_NAMES[name]}=...)" for name in sorted(legacy))
    warnings.warn(f"{where}: the keywords {spelled} moved into the options object: pass "
                  f"options=vlens.SweepOptions(...)", DeprecationWarning, stacklevel=3)
    if options != SweepOptions():
        raise UserInputError(f"{where}: give the run settings either as options=SweepOptions(...) or as the old "
                             f"keywords ({', '.join(sorted(legacy))}), not both")
    return options.replace(**changes)


__all__ = ["IMPLEMENTATIONS", "LEGACY_NAMES", "Readout", "SweepOptions", "fold_legacy"]

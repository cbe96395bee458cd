"""`verify_model` / `verify_spec`: run every check of `vlens.verify.checks` on the built-in cases."""

from __future__ import annotations

import datetime
import logging
from dataclasses import asdict, dataclass
from typing import Any

import torch
import transformers
from tqdm.auto import tqdm

import vlens
from vlens.utils.errors import UserInputError
from vlens.verify.cases import cases
from vlens.verify.checks import causality, compare_generation, compare_logits, cost, hook_coverage
from vlens.verify.results import CheckRecord, VerificationResult
from vlens.zoo.specs import load_model

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Tolerance:
    """What a dtype must meet. logits_rel: max |ours - HF| over real positions / max(|HF logit|, 1);
    top1: the share of real positions whose argmax agrees; edit_rel: the relative error of the
    hand-computed edits; exact_generation: greedy tokens must be identical (else a first difference
    at a near tie, HF's top-2 margin <= logits_rel x the logit scale, is accepted)."""

    logits_rel: float
    top1: float
    edit_rel: float
    exact_generation: bool


TOLERANCES: dict[torch.dtype, Tolerance] = {
    torch.float32: Tolerance(logits_rel=1e-4, top1=1.0, edit_rel=1e-4, exact_generation=True),
    torch.bfloat16: Tolerance(logits_rel=3e-2, top1=0.95, edit_rel=2e-2, exact_generation=False),
    torch.float16: Tolerance(logits_rel=5e-3, top1=0.98, edit_rel=5e-3, exact_generation=False),
}


@dataclass(frozen=True)
class VerifySettings:
    """max_new_tokens: greedy tokens compared per generation case; repeats: interleaved timing runs;
    case_names: the cases to run (None: all of `vlens.verify.cases.cases`)."""

    max_new_tokens: int = 6
    repeats: int = 3
    case_names: tuple[str, ...] | None = None


# which checks run on which case
_PLAN = {"one_image": ("logits", "generate", "hooks", "cost"), "two_images": ("logits",),
         "text_only": ("logits", "generate"), "padded_batch": ("logits", "generate", "causality"),
         "video": ("logits", "generate")}


def _versions() -> dict[str, str]:
    return {"vlens": vlens.__version__, "transformers": transformers.__version__, "torch": torch.__version__}


def _run_check(name: str, case: str, model: Any, inputs: Any, tol: Tolerance, settings: VerifySettings) -> CheckRecord:
    try:
        if name == "logits":
            return compare_logits(model, inputs, tol, case)
        if name == "generate":
            return compare_generation(model, inputs, tol, case, settings.max_new_tokens)
        if name == "hooks":
            return hook_coverage(model, inputs, case)
        if name == "causality":
            return causality(model, inputs, tol, case)
        return cost(model, inputs, settings.repeats, case)
    except Exception as error:  # a check that cannot run is a failed check, named, not a traceback
        logger.debug("check %s/%s failed", name, case, exc_info=True)
        return CheckRecord(name, case, "fail", {}, f"{type(error).__name__}: {error}")


def verify_model(model: Any, spec: str = "", settings: VerifySettings = VerifySettings(),
                 progress: bool = True) -> VerificationResult:
    """Every check on every built-in case, HookedVLM vs `model.hf_model` (which shares its weights)."""
    dtype = model.cfg.dtype
    tol = TOLERANCES.get(dtype)
    if tol is None:
        raise UserInputError(f"vlens verify has tolerances for {sorted(map(str, TOLERANCES))}, not {dtype}.")
    records: list[CheckRecord] = []
    if model.processor is None:  # nothing can be prepared: say so instead of skipping every case
        records.append(CheckRecord("load", "", "fail", {}, "the model has no processor / tokenizer: copy the original "
                                   "model's tokenizer and processor files into the folder"))
        return _result(model, spec, tol, records)
    built = cases(model)
    names = list(settings.case_names) if settings.case_names is not None else list(built)
    unknown = [n for n in names if n not in built]
    if unknown:
        raise UserInputError(f"vlens verify: unknown cases {unknown}; the cases are {list(built)}.")
    for case in tqdm(names, desc="verify", disable=not progress):
        make = built[case]
        if isinstance(make, str):
            records.append(CheckRecord("inputs", case, "skip", {}, make))
            continue
        try:
            inputs = make().to(model.input_device)
        except UserInputError as error:  # the family takes no such input: said, not failed
            records.append(CheckRecord("inputs", case, "skip", {}, str(error)))
            continue
        except Exception as error:
            records.append(CheckRecord("inputs", case, "fail", {}, f"{type(error).__name__}: {error}"))
            continue
        for check in _PLAN[case]:
            records.append(_run_check(check, case, model, inputs, tol, settings))
    return _result(model, spec, tol, records)


def _today() -> str:
    return datetime.datetime.now(datetime.timezone.utc).date().isoformat()


def _result(model: Any, spec: str, tol: Tolerance, records: list[CheckRecord]) -> VerificationResult:
    return VerificationResult(model=spec or model.cfg.architecture, architecture=model.cfg.architecture,
                              family=model.adapter.family, dtype=str(model.cfg.dtype).removeprefix("torch."),
                              device=str(model.input_device), versions=_versions(), date=_today(),
                              tolerances=asdict(tol), checks=records)


def verify_spec(spec: str, device: Any = None, dtype: Any = None, settings: VerifySettings = VerifySettings(),
                progress: bool = True, **load_options: Any) -> VerificationResult:
    """Load `spec` (hub id, folder, "tiny", "random-tiny") and verify it; a folder or checkpoint that does
    not load (config against weights, missing tokenizer / processor, ...) gives a result whose "load"
    check failed with the reason, instead of raising."""
    try:
        model = load_model(spec, device=device, dtype=dtype, progress=progress, **load_options)
    except Exception as error:
        logger.debug("loading %s failed", spec, exc_info=True)
        detail = str(error).splitlines()[0] if str(error) else type(error).__name__
        return VerificationResult(model=spec, architecture="", family="", dtype=str(dtype or ""),
                                  device=str(device or ""), versions=_versions(),
                                  date=_today(), tolerances={}, checks=[CheckRecord("load", "", "fail", {}, detail)])
    return verify_model(model, spec, settings, progress)

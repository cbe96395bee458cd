"""Model specs: the names `--model` and `vlens.load_model` accept, and how they are loaded.

    load_model("tiny")                                    # the embedded model (vlens.load())
    load_model("random-tiny")                             # a random tiny Qwen2.5-VL, for plumbing
    load_model("./runs/sft/merged")                       # a local model folder
    load_model("Qwen/Qwen2.5-VL-7B-Instruct", max_pixels=448 * 448)   # a hub id; cuda + bf16 when a GPU is there

Rules: a bare ``tiny`` is always the embedded model, even when a folder named ``tiny`` exists
here (a warning says so; write ``./tiny`` for the folder). A spec that looks like a path (it
starts with ``.``, ``/`` or ``~``, holds two or more ``/``, or its first part is a folder here)
must be an existing model folder: it is never tried as a hub id. Any other spec without an
``org/name`` form is an error rather than a hub download attempt.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vlens.utils.errors import UserInputError, failure_context
from vlens.utils.strict_json import loads_strict

if TYPE_CHECKING:
    from vlens.core.model import HookedVLM

logger = logging.getLogger(__name__)

EMBEDDED_MODEL = "tiny"
RANDOM_MODEL = "random-tiny"
SPEC_HELP = (f"'{EMBEDDED_MODEL}' (the embedded model), '{RANDOM_MODEL}' (a random tiny Qwen2.5-VL, for "
             "plumbing), a local model folder (./tiny for a folder named tiny) or a hub id (org/name)")


def looks_like_path(spec: str) -> bool:
    """True when `spec` can only mean a local path (never a hub id)."""
    if spec.startswith((".", "/", "~")) or spec.count("/") >= 2 or (os.sep != "/" and os.sep in spec):
        return True
    head, slash, _ = spec.partition("/")
    return bool(slash) and os.path.isdir(head)


def resolve_spec(spec: str) -> tuple[str, str]:
    """(kind, target): ("embedded"|"random", spec), ("folder", path) or ("hub", id); checks it first."""
    if not isinstance(spec, str) or not spec.strip():
        raise UserInputError(f"model spec {spec!r} is empty; use {SPEC_HELP}")
    if spec == EMBEDDED_MODEL:
        if os.path.isdir(spec):
            logger.warning("'tiny' is the embedded model; the folder ./tiny here is not used (pass ./tiny to load it)")
        return "embedded", spec
    if spec == RANDOM_MODEL:
        return "random", spec
    path = Path(spec).expanduser()
    if path.exists() or looks_like_path(spec):
        if not path.exists():
            raise UserInputError(f"model {spec!r}: no such folder ({path.absolute()})")
        if not path.is_dir():
            raise UserInputError(f"model {spec!r} is a file; pass the model folder (with config.json)")
        if not (path / "config.json").is_file():
            raise UserInputError(f"model folder {spec!r} holds no config.json; is it a Hugging Face model folder?")
        _check_config(path / "config.json", spec)
        return "folder", str(path)
    if spec.count("/") != 1 or spec.startswith("/") or spec.endswith("/"):
        raise UserInputError(f"model {spec!r} is not a folder here nor a hub id of the form org/name; use {SPEC_HELP}")
    return "hub", spec


def check_spec(spec: str) -> tuple[str, str]:
    """`resolve_spec`, and what can be checked before loading: a model folder validated whole
    (`vlens.core.model_folder.validate_model_folder`, tokenizer included), a hub id reachable or
    cached (`vlens.core.loading.check_hub_reachable`, seconds, not HF's minute of retries)."""
    kind, target = resolve_spec(spec)
    if kind == "folder":
        from vlens.core.model_folder import validate_model_folder

        validate_model_folder(target)
    elif kind == "hub":
        from vlens.core.hub import check_hub_reachable

        check_hub_reachable(target)
    return kind, target


def _check_config(path: Path, spec: str) -> None:
    """transformers answers a config.json without model_type with a bare ValueError traceback."""
    try:
        config = loads_strict(path.read_text(encoding="utf-8"), f"model folder {spec!r}: config.json")
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise UserInputError(f"model folder {spec!r}: config.json is not valid JSON ({err})") from None
    if not isinstance(config, dict) or not config.get("model_type"):
        raise UserInputError(f"model folder {spec!r}: config.json names no model_type; is it a Hugging Face model "
                             "folder?")


@contextmanager
def hf_progress_bars(enabled: bool) -> Iterator[None]:
    """Hide transformers' own bars (e.g. 'Loading weights') inside the block when not `enabled`."""
    if enabled:
        yield
        return
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


def load_model(spec: str = EMBEDDED_MODEL, *, device: Any = None, dtype: Any = None,
               image_size: int | None = None, min_pixels: int | None = None, max_pixels: int | None = None,
               progress: bool = True, **from_pretrained_kwargs: Any) -> HookedVLM:
    """The model `spec` names (see the module doc), as a HookedVLM in eval mode.

    device / dtype: defaults and names of `vlens.core.devices` (cuda when available, else cpu; bf16 on
        a GPU, fp32 on the CPU). image_size / min_pixels / max_pixels: the processor's resolution
        (`vlens.core.devices.configure_resolution`). progress: False hides transformers' loading bars.
    from_pretrained_kwargs: passed to `HookedVLM.from_pretrained` for folders and hub ids
        (device_map, trust_remote_code, allow_missing, ...).
    A bad spec raises `vlens.utils.errors.UserInputError` before anything is loaded.
    """
    from vlens.core.devices import configure_resolution, resolve_device, resolve_dtype
    from vlens.utils.provenance import note_model

    kind, target = resolve_spec(spec)
    if kind in ("embedded", "random") and from_pretrained_kwargs:
        raise UserInputError(f"{', '.join(sorted(from_pretrained_kwargs))}: only for a model folder or hub id; "
                             f"{spec!r} is built here (use device=... instead)")
    resolution = {"image_size": image_size, "min_pixels": min_pixels, "max_pixels": max_pixels}
    fix = ("check that it is a complete Hugging Face model folder (config.json, safetensors weights, tokenizer) "
           "saved by the transformers version installed here")
    with hf_progress_bars(progress), failure_context(f"loading the model {spec}", fix):
        if kind == "random":
            from vlens.zoo.random_tiny import random_tiny_model

            resolved = resolve_device(device)
            model = random_tiny_model().to(device=resolved, dtype=resolve_dtype(dtype, resolved))
            configure_resolution(model.processor, **resolution)
        elif kind == "embedded":
            from vlens.zoo import load

            model = load(device=device, dtype=dtype, **resolution)
        else:
            from vlens.core.model import HookedVLM

            model = HookedVLM.from_pretrained(target, device=device, dtype=dtype, image_size=image_size,
                                              min_pixels=min_pixels, max_pixels=max_pixels, **from_pretrained_kwargs)
    logger.debug("loaded %s (%s) on %s in %s", spec, kind, model.cfg.device, model.cfg.dtype)
    note_model(model, spec)  # as placed and cast: the provenance of every result computed with it
    return model.eval()


__all__ = ["EMBEDDED_MODEL", "RANDOM_MODEL", "SPEC_HELP", "check_spec", "hf_progress_bars", "load_model",
           "looks_like_path", "resolve_spec"]

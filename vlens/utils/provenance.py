"""How a result was made: the `provenance` block of every results.json.

    {"vlens_version": "0.1.0", "git_commit": "04f402e",            # the commit when run from a checkout
     "command_line": "vlens patch --model tiny --mode layer-head ...", "command": "patch",
     "started_at": "2026-12-02T10:41:07Z", "written_at": "2026-12-02T10:41:19Z",
     "seeds": {"seed": 0}, "world_size": 1,
     "torch_version": "2.13.0+cpu", "transformers_version": "5.24.0", "python_version": "3.11.7",
     "model": {"spec": "tiny", "architecture": "Qwen2_5_VLForConditionalGeneration", "dtype": "float32",
               "device": "cpu", "n_parameters": 1534592, "weights_digest": "…", "weights_digest_method": "…"},
     "models": [...]}                                               # when the run loaded several

It is built once, here, and added where results are written (`stamp`, called by
`vlens.utils.results.Result.save` and the command line's `write_results`), so a new command gets
it without doing anything. A command of the `vlens` command line runs inside `run_context`
(its command line, start time, seeds and world size); a model that is loaded (`HookedVLM.from_hf`,
`vlens.load_model`) is recorded with `note_model`. Outside the command line (Python, notebooks)
the command line is the interpreter's `sys.argv`, the start time the first model's loading (or
this module's import) and the models those still alive.

The weights digest is cheap enough for a 7B model on any device: sha256 over every parameter
and buffer in name order of its name, dtype, shape and up to `DIGEST_SAMPLES` elements at a
fixed stride (as float32 bytes). Equal weights give equal digests; a change of most weights
(fine-tuning, merged LoRA, another dtype) changes it, but a change confined to elements between
the samples can go unseen: `weights_fingerprint` (every element) is the exact check, used for
the shipped study files (`same_weights`).
"""

from __future__ import annotations

import contextvars
import datetime as _dt
import functools
import hashlib
import os
import platform
import shlex
import subprocess
import sys
import weakref
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vlens.utils.errors import UserInputError

if TYPE_CHECKING:  # torch is imported where weights are hashed: `vlens data` writes provenance without it
    from torch import nn

DIGEST_SAMPLES = 4096  # elements sampled per tensor for the weights digest
DIGEST_METHOD = (f"sha256 over every parameter and buffer (name order) of name, dtype, shape and {DIGEST_SAMPLES} "
                 "elements at a fixed stride as float32 (tensors on the meta device: name, dtype, shape only)")


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def weights_fingerprint(model: nn.Module) -> str:
    """sha256 (first 16 hex digits) of every parameter and buffer, in name order, as float32 bytes.

    Independent of the file format and of the device; changes when any weight changes. Reads every
    element (exact, but slow for a large model): provenance uses `weights_digest`.
    """
    import torch

    digest = hashlib.sha256()
    tensors: dict[str, torch.Tensor] = {**dict(model.named_parameters()), **dict(model.named_buffers())}
    for name in sorted(tensors):
        tensor = tensors[name]
        if tensor.is_meta:
            raise UserInputError(f"cannot fingerprint {name}: it is on the meta device (offloaded)")
        digest.update(name.encode())
        digest.update(tensor.detach().to("cpu", torch.float32).contiguous().numpy().tobytes())
    return digest.hexdigest()[:16]


def weights_digest(model: nn.Module, samples: int = DIGEST_SAMPLES) -> str:
    """sha256 (first 16 hex digits) of a sample of the weights (`DIGEST_METHOD`): cheap on any model."""
    import torch

    digest = hashlib.sha256()
    tensors: dict[str, torch.Tensor] = {**dict(model.named_parameters()), **dict(model.named_buffers())}
    with torch.no_grad():
        for name in sorted(tensors):
            tensor = tensors[name]
            digest.update(f"{name}|{str(tensor.dtype).removeprefix('torch.')}|{tuple(tensor.shape)}".encode())
            if tensor.is_meta or tensor.numel() == 0:
                continue
            flat = tensor.detach().view(-1) if tensor.is_contiguous() else tensor.detach().flatten()
            if flat.is_complex():  # Llama 4's vision rotary table: both parts, as reals
                flat = torch.view_as_real(flat).flatten()
            step = max(1, flat.numel() // samples)
            digest.update(flat[::step][:samples].to("cpu", torch.float32).contiguous().numpy().tobytes())
    return digest.hexdigest()[:16]


@functools.lru_cache(maxsize=1)
def source_commit() -> str | None:
    """The git commit of the vlens checkout in use (None when vlens is not run from a git checkout)."""
    root = Path(__file__).resolve().parents[2]
    if not (root / ".git").exists():
        return None
    try:
        out = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return None


def _torch_version() -> str | None:
    torch = sys.modules.get("torch")  # the one in use when imported (a source build may lack metadata)
    return getattr(torch, "__version__", None) or _version("torch")


# ---------------------------------------------------------------------- the run and its models
@dataclass
class RunContext:
    """What one run (a command, or a Python session) records for its results' provenance."""

    command_line: str
    command: str | None = None
    started_at: str = field(default_factory=_now)
    seeds: dict[str, Any] = field(default_factory=dict)
    world_size: int = 1
    keep_dead_models: bool = True  # a command lists every model it loaded; a session only those alive
    _models: list[tuple[Any, dict]] = field(default_factory=list)

    def note_model(self, model: nn.Module, info: dict) -> None:
        for index, (ref, _) in enumerate(self._models):
            if ref() is model:
                self._models[index] = (ref, info)
                return
        try:
            ref = weakref.ref(model)
        except TypeError:  # pragma: no cover - nn.Modules are weak-referenceable
            ref = (lambda m: (lambda: m))(model)
        self._models.append((ref, info))

    def models(self) -> list[dict]:
        return [dict(info) for ref, info in self._models if self.keep_dead_models or ref() is not None]


_SESSION = RunContext(command_line=shlex.join(["python", *sys.argv]), keep_dead_models=False)
_current: contextvars.ContextVar[RunContext | None] = contextvars.ContextVar("vlens_run", default=None)


def current_run() -> RunContext:
    """The command being run (inside `run_context`), else the Python session's record."""
    return _current.get() or _SESSION


@contextmanager
def run_context(argv: Sequence[str], command: str | None = None, program: str = "vlens") -> Iterator[RunContext]:
    """Record one command (its command line and start time) for the provenance of what it writes."""
    context = RunContext(command_line=shlex.join([program, *argv]), command=command)
    token = _current.set(context)
    try:
        yield context
    finally:
        _current.reset(token)


def note_run(seeds: Mapping[str, Any] | None = None, world_size: int | None = None) -> None:
    """Add the run's seeds (name -> value) and its number of processes to the current run."""
    run = current_run()
    if seeds:
        run.seeds.update({str(k): v for k, v in seeds.items()})
    if world_size is not None:
        run.world_size = int(world_size)


def seeds_of(options: Mapping[str, Any]) -> dict[str, Any]:
    """The seeds among a command's options (``seed``, ``retest_seed``, ``seeds``, ...), set or not."""
    return {key: value for key, value in options.items()
            if "seed" in key and (value is None or isinstance(value, (int, list, tuple)))
            and not isinstance(value, bool)}


def model_info(model: nn.Module, spec: str | None = None) -> dict:
    """What provenance records of a model: spec, architecture, dtype, device(s), size and weights digest."""
    cfg = getattr(model, "cfg", None)
    parameters = list(model.parameters())
    devices = sorted({str(p.device) for p in parameters})
    dtypes = sorted({str(p.dtype).removeprefix("torch.") for p in parameters})
    hf = getattr(model, "hf_model", None)
    architecture = getattr(cfg, "architecture", None) or type(hf if hf is not None else model).__name__
    if spec is None and hf is not None:
        spec = getattr(getattr(hf, "config", None), "_name_or_path", None) or None
    return {"spec": recorded_model_spec(spec), "architecture": architecture,
            "dtype": dtypes[0] if len(dtypes) == 1 else dtypes,
            "device": devices[0] if len(devices) == 1 else devices,
            "n_parameters": sum(p.numel() for p in parameters),
            "weights_digest": weights_digest(model), "weights_digest_method": DIGEST_METHOD}


def recorded_model_spec(spec: str | None) -> str | None:
    """A model as provenance records it: a local folder as its absolute path (it reads the same from any
    working folder); a hub id, `tiny`, `random-tiny` as given."""
    if spec is None or spec in ("tiny", "random-tiny"):
        return spec
    path = os.path.expanduser(spec)
    return os.path.abspath(path) if os.path.isdir(path) else spec


def note_model(model: nn.Module, spec: str | None = None) -> None:
    """Record a loaded model (and its weights digest, now) for the provenance of the current run."""
    run = current_run()
    if run is _SESSION and not _SESSION._models:
        _SESSION.started_at = _now()  # a session starts with its first model
    if spec is None:
        spec = getattr(model, "vlens_spec", None)
    else:
        try:
            model.vlens_spec = spec  # type: ignore[assignment]  # a later note keeps the spec it was loaded by
        except AttributeError:  # pragma: no cover - a module refusing attributes
            pass
    run.note_model(model, model_info(model, spec))


def provenance(model: nn.Module | None = None, fingerprint: bool = False) -> dict:
    """The provenance of a result written now (see the module docstring).

    model: record this model (its state now) as the run's model, in addition to those noted;
    fingerprint: also its exact `weights_fingerprint` (every element; for files shipped with a model).
    """
    run = current_run()
    models = run.models()
    if model is not None:
        info = model_info(model, getattr(model, "vlens_spec", None))
        models = [m for m in models if m.get("weights_digest") != info["weights_digest"]] + [info]
        if fingerprint:
            info["weights_fingerprint"] = weights_fingerprint(model)
    world_size = run.world_size if _current.get() is not None else int(os.environ.get("WORLD_SIZE", "1") or 1)
    return {
        "vlens_version": _version("vlens"), "git_commit": source_commit(),
        "command_line": run.command_line, "command": run.command,
        "started_at": run.started_at, "written_at": _now(),
        "seeds": dict(run.seeds), "world_size": world_size,
        "torch_version": _torch_version(), "transformers_version": _version("transformers"),
        "python_version": platform.python_version(),
        "model": models[-1] if models else None,
        **({"models": models} if len(models) > 1 else {}),  # every model the run loaded, when several
        **({"weights_fingerprint": models[-1]["weights_fingerprint"]} if fingerprint and model is not None else {}),
    }


def stamp(payload: dict, model: nn.Module | None = None) -> dict:
    """`payload` with its `provenance` (a result that already carries one, e.g. read back from a file
    or a study measured earlier, keeps it)."""
    if payload.get("provenance"):
        return payload
    return {**payload, "provenance": provenance(model)}


def same_weights(stored: dict | None, model: nn.Module) -> bool | None:
    """True / False when the stored provenance names a fingerprint (exact) or a digest, else None (unknown)."""
    stored = stored or {}
    fingerprint = stored.get("weights_fingerprint")
    if fingerprint:
        return fingerprint == weights_fingerprint(model)
    digest = (stored.get("model") or {}).get("weights_digest") if isinstance(stored.get("model"), dict) else None
    return None if not digest else digest == weights_digest(model)


__all__ = ["DIGEST_METHOD", "RunContext", "current_run", "model_info", "note_model", "note_run", "provenance",
           "recorded_model_spec",
           "run_context", "same_weights", "seeds_of", "source_commit", "stamp", "weights_digest",
           "weights_fingerprint"]

"""Where a stored result came from: when it was measured, by which vlens, on which weights.

A result file shipped with a model (the interventions study, an evaluation) goes stale when the
weights change. `provenance(model)` is stored with it; `same_weights(stored, model)` tells a
reader (the demo report) whether the file was measured on the weights now loaded.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import subprocess
from importlib import metadata
from pathlib import Path

import torch
from torch import nn


def weights_fingerprint(model: nn.Module) -> str:
    """sha256 (first 16 hex digits) of every parameter and buffer, in name order, as float32 bytes.

    Independent of the file format and of the device; changes when any weight changes.
    """
    digest = hashlib.sha256()
    tensors: dict[str, torch.Tensor] = dict(model.named_parameters())
    tensors.update(dict(model.named_buffers()))
    for name in sorted(tensors):
        tensor = tensors[name]
        if tensor.is_meta:
            raise ValueError(f"cannot fingerprint {name}: it is on the meta device (offloaded)")
        digest.update(name.encode())
        digest.update(tensor.detach().to("cpu", torch.float32).contiguous().numpy().tobytes())
    return digest.hexdigest()[:16]


def source_commit() -> str | None:
    """The git commit of the vlens checkout in use (None when vlens is not run from a git checkout)."""
    root = Path(__file__).resolve().parents[1]
    if not (root / ".git").exists():
        return None
    try:
        out = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def _vlens_version() -> str | None:
    try:
        return metadata.version("vlens")
    except metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return None


def provenance(model: nn.Module | None = None) -> dict:
    """`{"measured_at": UTC time, "vlens_version", "commit", "weights_fingerprint"}` for a stored result."""
    return {
        "measured_at": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "vlens_version": _vlens_version(),
        "commit": source_commit(),
        "weights_fingerprint": None if model is None else weights_fingerprint(model),
    }


def same_weights(stored: dict | None, model: nn.Module) -> bool | None:
    """True / False when the stored provenance names a fingerprint, else None (unknown)."""
    fingerprint = (stored or {}).get("weights_fingerprint")
    if not fingerprint:
        return None
    return fingerprint == weights_fingerprint(model)


__all__ = ["provenance", "same_weights", "source_commit", "weights_fingerprint"]

"""Training checkpoints in safetensors + JSON (no pickle): LoRA weights, AdamW state, RNG.

Layout: `<out>/checkpoints/step-000012/` with `lora.safetensors`, `optimizer.safetensors`,
`rng.safetensors` and `state.json` (written last: a folder without it is incomplete and
ignored, so an interruption while saving never leaves a broken "latest" checkpoint).
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from vlens.utils.errors import UserInputError
from vlens.utils.fileio import atomic_write_json, read_json_file

STATE_FILE = "state.json"


def checkpoint_dir(out_dir: str | Path, step: int) -> Path:
    return Path(out_dir) / "checkpoints" / f"step-{step:06d}"


def latest_checkpoint(out_dir: str | Path) -> Path | None:
    """The complete checkpoint with the highest step, or None."""
    root = Path(out_dir) / "checkpoints"
    done = sorted(p for p in root.glob("step-*") if (p / STATE_FILE).is_file()) if root.is_dir() else []
    return done[-1] if done else None


def _optimizer_tensors(optimizer: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], dict]:
    state = optimizer.state_dict()
    tensors, scalars = {}, {}
    for index, values in state["state"].items():
        for key, value in values.items():
            if isinstance(value, torch.Tensor):
                tensors[f"{index}.{key}"] = value.detach().cpu().contiguous().clone()
            else:
                scalars[f"{index}.{key}"] = value
    return tensors, {"param_groups": state["param_groups"], "scalars": scalars}


def _optimizer_state(tensors: dict[str, torch.Tensor], meta: dict) -> dict:
    state: dict[int, dict] = {}
    for key, value in tensors.items():
        index, _, name = key.partition(".")
        state.setdefault(int(index), {})[name] = value
    for key, value in meta["scalars"].items():
        index, _, name = key.partition(".")
        state.setdefault(int(index), {})[name] = value
    return {"state": state, "param_groups": meta["param_groups"]}


def save_checkpoint(
    out_dir: str | Path,
    step: int,
    lora: Mapping[str, torch.Tensor],
    optimizer: torch.optim.Optimizer,
    info: dict,
    keep: int = 2,
) -> Path:
    """Write one checkpoint; keep only the `keep` most recent complete ones."""
    folder = checkpoint_dir(out_dir, step)
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    save_file(
        {k: v.detach().cpu().contiguous().clone() for k, v in lora.items()}, str(folder / "lora.safetensors")
    )
    tensors, meta = _optimizer_tensors(optimizer)
    save_file(tensors, str(folder / "optimizer.safetensors"))
    rng = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        rng.update({f"cuda{i}": s for i, s in enumerate(torch.cuda.get_rng_state_all())})
    save_file(rng, str(folder / "rng.safetensors"))
    atomic_write_json(folder / STATE_FILE, {"step": step, "optimizer": meta, **info})  # last, and whole or absent
    if keep > 0:
        root = folder.parent
        done = sorted(p for p in root.glob("step-*") if (p / STATE_FILE).is_file())
        for old in done[:-keep]:
            shutil.rmtree(old)
    return folder


def load_checkpoint(
    folder: str | Path, lora: dict[str, torch.nn.Parameter], optimizer: torch.optim.Optimizer
) -> dict:
    """Restore LoRA weights, optimizer state and RNG from `folder`; returns state.json."""
    folder = Path(folder)
    info = read_json_file(folder / STATE_FILE, "the checkpoint state", f"delete {folder} to resume from the one before")
    weights = load_file(str(folder / "lora.safetensors"))
    if set(weights) != set(lora):
        raise UserInputError(
            f"checkpoint {folder} holds other LoRA parameters than the model "
            f"({len(weights)} vs {len(lora)}); resume with the same LoRA settings"
        )
    with torch.no_grad():
        for name, parameter in lora.items():
            parameter.copy_(weights[name].to(parameter.device, parameter.dtype))
    optimizer.load_state_dict(
        _optimizer_state(load_file(str(folder / "optimizer.safetensors")), info["optimizer"])
    )
    rng = load_file(str(folder / "rng.safetensors"))
    torch.set_rng_state(rng["cpu"])
    cuda = [rng[k] for k in sorted(rng) if k.startswith("cuda")]
    if cuda and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(cuda)
    return info

"""SAELens's on-disk format, both ways, without sae-lens: ``cfg.json`` + ``sae_weights.safetensors``.

`save_sae` writes SAELens 6's layout: the config dataclass's fields at the top level
(``d_in``, ``d_sae``, ``dtype``, ``device``, ``apply_b_dec_to_input``, ``normalize_activations``,
``reshape_activations``, ``k`` / ``rescale_acts_by_decoder_norm`` for TopK), ``architecture``, and
``metadata`` (``hook_name``, ``model_name``, ``sae_lens_version``, ...); the weights under
SAELens's keys (``W_enc [d_in, d_sae]``, ``W_dec [d_sae, d_in]``, ``b_enc``, ``b_dec``,
``threshold`` for JumpReLU). ``sae_lens.SAE.load_from_disk(folder)`` reads it.

`load_sae` reads folders saved by SAELens 6 and by older versions (``hook_point`` /
``activation_fn_str`` / top-level ``hook_name``, TopK as ``activation_fn: "topk"`` with
``activation_fn_kwargs.k``, boolean ``normalize_activations``); the architecture comes from the config.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from vlens.sae.base import SAE
from vlens.sae.config import SAEConfig
from vlens.sae.registry import architecture_classes, build_sae
from vlens.utils.errors import UserInputError
from vlens.utils.fileio import atomic_write, atomic_write_json, load_float_tensors, read_json_file

CFG_FILE = "cfg.json"
WEIGHTS_FILE = "sae_weights.safetensors"
FORMAT_VERSION = "6.0.0"  # the SAELens config layout these files follow (metadata.sae_lens_version)
# SAELens 6 keeps these in metadata (older versions at the top level)
METADATA_KEYS = ("model_name", "hook_name", "model_class_name", "hook_head_index", "model_from_pretrained_kwargs",
                 "prepend_bos", "exclude_special_tokens", "neuronpedia_id", "context_size", "seqpos_slice",
                 "dataset_path", "sae_lens_version", "sae_lens_training_version")


def save_sae(sae: SAE, folder: str | os.PathLike) -> Path:
    """Write `sae` as a SAELens folder (created if needed); returns the folder."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    cfg = sae.cfg.to_dict()
    hook_name = cfg.pop("hook_name")
    metadata = {"sae_lens_version": FORMAT_VERSION, "sae_lens_training_version": FORMAT_VERSION,
                **cfg.pop("metadata"), "hook_name": hook_name}
    metadata.setdefault("written_by", "vlens")
    cfg["metadata"] = metadata
    cfg["dtype"] = str(sae.dtype).removeprefix("torch.")
    cfg["device"] = str(sae.W_enc.device)
    # each file whole or not at all: an interrupted save never leaves a 0-byte cfg.json
    atomic_write(folder / WEIGHTS_FILE, lambda staging: save_file({k: v.cpu() for k, v in sae.state().items()},
                                                                   str(staging)))
    atomic_write_json(folder / CFG_FILE, cfg)
    return folder


def is_sae_folder(folder: str | os.PathLike) -> bool:
    folder = Path(folder)
    return (folder / CFG_FILE).is_file() and (folder / WEIGHTS_FILE).is_file()


def _version_tuple(text: Any) -> tuple[int, ...]:
    digits = []
    for part in str(text).split(".")[:3]:
        number = "".join(ch for ch in part if ch.isdigit())
        digits.append(int(number) if number else 0)
    return tuple(digits)


def normalize_config(raw: dict[str, Any]) -> dict[str, Any]:
    """A cfg.json of any SAELens version as the fields of vlens's config (+ ``architecture``)."""
    metadata = dict(raw.get("metadata") or {})
    version = raw.get("sae_lens_version") or metadata.get("sae_lens_version")
    cfg = dict(raw)
    if not version or _version_tuple(version) < (6,):
        renames = {"hook_point": "hook_name", "hook_point_head_index": "hook_head_index",
                   "activation_fn_str": "activation_fn"}
        cfg = {renames.get(k, k): v for k, v in cfg.items()}
        cfg.setdefault("architecture", "standard")
        kwargs = cfg.get("activation_fn_kwargs") or {}
        if cfg.get("activation_fn") == "topk" and kwargs.get("k") is not None:
            cfg["architecture"], cfg["k"] = "topk", kwargs["k"]
        if isinstance(cfg.get("normalize_activations"), bool):
            cfg["normalize_activations"] = "expected_average_only_in" if cfg["normalize_activations"] else "none"
        metadata = {**{k: cfg[k] for k in METADATA_KEYS if k in cfg}, **metadata}
    if cfg.get("normalize_activations") is None:
        cfg["normalize_activations"] = "none"
    cfg.setdefault("reshape_activations", "hook_z" if "hook_z" in str(metadata.get("hook_name") or
                                                                       cfg.get("hook_name") or "") else "none")
    hook_name = metadata.pop("hook_name", None) or cfg.get("hook_name")
    architecture = cfg.get("architecture", "standard")
    config_class = architecture_classes(architecture)[1]
    out = {k: v for k, v in cfg.items() if k in config_class.field_names() and k not in ("metadata", "hook_name")}
    out.update(architecture=architecture, hook_name=hook_name, metadata=metadata)
    return out


def load_sae(folder: str | os.PathLike, device: str | torch.device | None = None,
             dtype: str | torch.dtype | None = None) -> SAE:
    """An SAE from a SAELens folder (saved by SAELens, any version, or by `save_sae`).

    device / dtype: where and in what to put it (default: the config's dtype, the CPU).
    """
    folder = Path(folder)
    if not is_sae_folder(folder):
        raise UserInputError(f"{folder} is not an SAE folder: it needs {CFG_FILE} and {WEIGHTS_FILE} "
                             "(as SAELens's save_model and vlens.sae.save_sae write them).")
    raw = read_json_file(folder / CFG_FILE, "the SAE config", "write the SAE folder again (train or convert it anew)")
    if not isinstance(raw, dict):
        raise UserInputError(f"{folder / CFG_FILE} must hold a JSON object.")
    fields = normalize_config(raw)
    architecture = fields.pop("architecture")
    if dtype is not None:
        fields["dtype"] = str(dtype).removeprefix("torch.")
    fields["device"] = str(device) if device is not None else "cpu"
    missing = {"d_in", "d_sae"} - set(fields)
    if missing:
        raise UserInputError(f"{folder / CFG_FILE} lacks {sorted(missing)}.")
    config_class = architecture_classes(architecture)[1]
    cfg: SAEConfig = config_class(**fields)
    sae = build_sae(cfg)
    state = load_float_tensors(folder / WEIGHTS_FILE, "the SAE weights", device=str(cfg.device))
    state = _state_for_loading(state, raw, folder)
    expected = set(sae.state_dict())
    if set(state) != expected:
        raise UserInputError(f"{folder / WEIGHTS_FILE} holds {sorted(state)} but a {architecture} SAE needs "
                             f"{sorted(expected)}.")
    for name, value in sae.state_dict().items():
        if state[name].shape != value.shape:
            raise UserInputError(f"{folder / WEIGHTS_FILE}: {name} has shape {tuple(state[name].shape)}, the config "
                                 f"(d_in={cfg.d_in}, d_sae={cfg.d_sae}) needs {tuple(value.shape)}.")
    sae.load_state(state)
    return sae


def _state_for_loading(state: dict[str, torch.Tensor], raw: dict[str, Any], folder: Path) -> dict[str, torch.Tensor]:
    state = dict(state)
    if "log_threshold" in state and "threshold" not in state:  # a JumpReLU training checkpoint
        state["threshold"] = state.pop("log_threshold").exp()
    scale = state.pop("scaling_factor", None)
    if scale is not None and not torch.allclose(scale, torch.ones_like(scale)):
        raise UserInputError(f"{folder / WEIGHTS_FILE} holds a fine-tuning scaling_factor that is not all ones "
                             "(finetuning_scaling_factor): vlens does not run those; fold it into W_dec first.")
    return state

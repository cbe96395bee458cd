"""Transcoder files: vlens's own folder, SAELens's transcoder folders (both ways), circuit-tracer's set (read).

vlens's folder (every kind, CLTs included): ``transcoder_config.json`` (`TranscoderConfig.to_dict`) +
``transcoder_weights.safetensors`` (`Transcoders.state`). No pickle anywhere.

SAELens (per-layer transcoders only: a CLT has no SAELens form): one sub-folder ``layer_{l}`` per
covered layer, each SAELens 6's ``cfg.json`` + ``sae_weights.safetensors`` with architecture
"transcoder" (ReLU), "skip_transcoder" or "jumprelu_transcoder"; ``W_enc [d_in, d_sae]``,
``W_dec [d_sae, d_out]``, ``b_enc``, ``b_dec [d_out]``, ``threshold``, ``W_skip [d_out, d_in]``
(SAELens applies ``x @ W_skip.T``); ``metadata.hook_name_out`` names the layer's ``hook_mlp_out``.

circuit-tracer: a YAML file listing ``transcoders: [{layer, filepath}]`` (local files; ``hf://`` paths
must be downloaded first), each a ReLU safetensors file (``W_enc [d_tc, d]``, ``W_dec [d, d_tc]``,
``b_enc``, ``b_dec``, optional ``W_skip`` applied as ``x @ W_skip.T``) or a Gemma Scope ``.npz``
(``W_enc [d, d_tc]``, ``W_dec [d_tc, d]``, ``b_enc``, ``b_dec``, ``threshold``: JumpReLU).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from torch import Tensor

from vlens.transcoders.config import TranscoderConfig
from vlens.transcoders.model import Transcoders
from vlens.utils.errors import UserInputError
from vlens.utils.fileio import check_float_tensors, load_float_tensors
from vlens.utils.strict_json import loads_strict

CONFIG_FILE = "transcoder_config.json"
WEIGHTS_FILE = "transcoder_weights.safetensors"
SAELENS_ARCHITECTURES = {("plt", "relu"): "transcoder", ("skip", "relu"): "skip_transcoder",
                         ("plt", "jumprelu"): "jumprelu_transcoder"}
SAELENS_VERSION = "6.0.0"
LAYER_FOLDER = re.compile(r"layer_(\d+)$")


# ---------------------------------------------------------------------------------------------- vlens
def save_transcoders(tc: Transcoders, folder: str | os.PathLike) -> Path:
    """Write `tc` as vlens's folder (created if needed); returns the folder."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    save_file({k: v.cpu() for k, v in tc.state().items()}, str(folder / WEIGHTS_FILE))
    (folder / CONFIG_FILE).write_text(json.dumps(tc.cfg.to_dict(), indent=1) + "\n", encoding="utf-8")
    return folder


def is_transcoder_folder(folder: str | os.PathLike) -> bool:
    folder = Path(folder)
    return (folder / CONFIG_FILE).is_file() and (folder / WEIGHTS_FILE).is_file()


def holds_transcoders(folder: str | os.PathLike) -> bool:
    """Whether `folder` is a transcoder set `load_transcoders` reads: vlens's folder, SAELens ``layer_{l}``
    sub-folders, or one SAELens layer folder whose architecture is a transcoder's (an SAE folder is not)."""
    folder = Path(folder)
    if is_transcoder_folder(folder) or (folder.is_dir() and saelens_layers(folder)):
        return True
    try:
        raw = json.loads((folder / "cfg.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(raw, dict) and raw.get("architecture") in SAELENS_ARCHITECTURES.values()


def load_transcoders(path: str | os.PathLike, device: str | torch.device = "cpu") -> Transcoders:
    """Transcoders from vlens's folder, a SAELens transcoder folder (``layer_{l}`` sub-folders, or one
    layer's folder) or a circuit-tracer YAML file."""
    path = Path(path)
    if path.is_file() and path.suffix in (".yaml", ".yml"):
        return load_circuit_tracer(path).to(device)
    if is_transcoder_folder(path):
        raw = loads_strict((path / CONFIG_FILE).read_text(encoding="utf-8"), str(path / CONFIG_FILE))
        if not isinstance(raw, dict):
            raise UserInputError(f"{path / CONFIG_FILE} must hold a JSON object.")
        tc = Transcoders(TranscoderConfig.from_dict(raw))
        tc.load_state(load_float_tensors(path / WEIGHTS_FILE, "the transcoder weights"))
        return tc.to(device)
    if path.is_dir() and (saelens_layers(path) or (path / "cfg.json").is_file()):
        return load_saelens_transcoders(path).to(device)
    raise UserInputError(f"{path} holds no transcoders: expected vlens's folder ({CONFIG_FILE} + {WEIGHTS_FILE}), "
                         "SAELens transcoder folders (layer_<l>/cfg.json + sae_weights.safetensors) or a "
                         "circuit-tracer .yaml file.")


# ---------------------------------------------------------------------------------------------- SAELens
def save_saelens_transcoders(tc: Transcoders, folder: str | os.PathLike, model_name: str = "") -> Path:
    """Write per-layer transcoders as SAELens folders ``folder/layer_{l}`` (see the module doc)."""
    cfg = tc.cfg
    architecture = SAELENS_ARCHITECTURES.get((cfg.kind, cfg.activation))
    if architecture is None:
        raise UserInputError(f"SAELens has no transcoder architecture for a {cfg.kind} / {cfg.activation} set (it has "
                             "ReLU, skip and JumpReLU per-layer transcoders): save it with save_transcoders.")
    folder = Path(folder)
    for i, layer in enumerate(cfg.layers):
        sub = folder / f"layer_{layer}"
        sub.mkdir(parents=True, exist_ok=True)
        state: dict[str, Tensor] = {"W_enc": tc.W_enc[i], "b_enc": tc.b_enc[i], "W_dec": tc.decoder(i, i),
                                    "b_dec": tc.b_dec[i]}
        if tc.threshold is not None:
            state["threshold"] = tc.threshold[i]
        if tc.W_skip is not None:
            state["W_skip"] = tc.W_skip[i].T
        save_file({k: v.detach().cpu().contiguous() for k, v in state.items()}, str(sub / "sae_weights.safetensors"))
        config = {"architecture": architecture, "d_in": cfg.d_model, "d_sae": cfg.d_tc, "d_out": cfg.d_model,
                  "dtype": cfg.dtype, "device": "cpu", "apply_b_dec_to_input": False,
                  "normalize_activations": "none", "reshape_activations": "none",
                  "metadata": {"sae_lens_version": SAELENS_VERSION, "model_name": model_name,
                               # vlens reads the MLP input: the second norm's output of this block
                               "hook_name": f"blocks.{layer}.ln2.hook_normalized",
                               "hook_name_out": f"blocks.{layer}.hook_mlp_out", "written_by": "vlens",
                               "vlens_input": "the MLP's input (block.ln2 applied to hook_resid_mid, weight included)"}}
        (sub / "cfg.json").write_text(json.dumps(config, indent=1) + "\n", encoding="utf-8")
    return folder


def saelens_layers(folder: Path) -> list[Path]:
    return sorted((p for p in folder.iterdir() if p.is_dir() and LAYER_FOLDER.search(p.name)
                   and (p / "cfg.json").is_file()), key=lambda p: int(LAYER_FOLDER.search(p.name).group(1)))  # type: ignore[union-attr]


def _saelens_layer(sub: Path) -> tuple[int, str, dict[str, Tensor], dict[str, Any]]:
    raw = loads_strict((sub / "cfg.json").read_text(encoding="utf-8"), str(sub / "cfg.json"))
    if not isinstance(raw, dict):
        raise UserInputError(f"{sub / 'cfg.json'} must hold a JSON object.")
    architecture = raw.get("architecture")
    kinds = {name: key for key, name in SAELENS_ARCHITECTURES.items()}
    if architecture not in kinds:
        raise UserInputError(f"{sub / 'cfg.json'}: architecture {architecture!r} is no SAELens transcoder vlens reads "
                             f"({', '.join(sorted(kinds))}).")
    metadata = dict(raw.get("metadata") or {})
    hook = str(metadata.get("hook_name_out") or raw.get("hook_name_out") or metadata.get("hook_name") or "")
    match = re.search(r"blocks\.(\d+)\.", hook) or LAYER_FOLDER.search(sub.name)
    if match is None:
        raise UserInputError(f"{sub / 'cfg.json'} names no layer (metadata.hook_name_out 'blocks.<l>.hook_mlp_out').")
    if raw.get("d_in") != raw.get("d_out"):
        raise UserInputError(f"{sub}: an MLP transcoder maps d_model to d_model, this one {raw.get('d_in')} -> "
                             f"{raw.get('d_out')}.")
    state = load_float_tensors(sub / "sae_weights.safetensors", "the transcoder weights")
    return int(match.group(1)), architecture, state, raw


def load_saelens_transcoders(folder: str | os.PathLike) -> Transcoders:
    """Per-layer transcoders from SAELens folders (``layer_{l}`` sub-folders, or a single layer's folder)."""
    folder = Path(folder)
    subs = saelens_layers(folder) or [folder]
    layers = [_saelens_layer(sub) for sub in subs]
    architectures = {arch for _, arch, _, _ in layers}
    if len(architectures) != 1:
        raise UserInputError(f"{folder}: the layers mix architectures {sorted(architectures)}; one set has one.")
    kind, activation = {name: key for key, name in SAELENS_ARCHITECTURES.items()}[architectures.pop()]
    raw = layers[0][3]
    cfg = TranscoderConfig(kind=kind, activation=activation, layers=tuple(sorted(layer for layer, *_ in layers)),
                           d_model=int(raw["d_in"]), d_tc=int(raw["d_sae"]), dtype=str(raw.get("dtype", "float32")),
                           metadata={"read_from": "saelens", "model_name": (raw.get("metadata") or {}).get("model_name")})
    tc = Transcoders(cfg)
    state: dict[str, list[Tensor]] = {}
    for _, _, weights, _ in sorted(layers, key=lambda item: item[0]):
        for key, value in weights.items():
            state.setdefault(key, []).append(value)
    return _fill(tc, state, skip_transposed=True, source=str(folder))


def _fill(tc: Transcoders, state: dict[str, list[Tensor]], skip_transposed: bool, source: str) -> Transcoders:
    """Load per-layer PLT tensors (``W_enc [d, f]``, ``W_dec [f, d]``, ...) into `tc`."""
    need = {"W_enc", "b_enc", "W_dec", "b_dec"} | ({"threshold"} if tc.threshold is not None else set()) \
        | ({"W_skip"} if tc.W_skip is not None else set())
    missing = need - set(state)
    if missing:
        raise UserInputError(f"{source}: the transcoder weights lack {sorted(missing)}.")
    flat = {"W_enc": torch.stack(state["W_enc"]), "b_enc": torch.stack(state["b_enc"]),
            "b_dec": torch.stack(state["b_dec"])}
    for i, w in enumerate(state["W_dec"]):
        flat[f"W_dec.{i}"] = w.unsqueeze(1)
    if tc.threshold is not None:
        flat["threshold"] = torch.stack(state["threshold"])
    if tc.W_skip is not None:
        flat["W_skip"] = torch.stack([w.T if skip_transposed else w for w in state["W_skip"]])
    tc.load_state(flat)
    return tc


# ---------------------------------------------------------------------------------------------- circuit-tracer
def load_circuit_tracer(config_file: str | os.PathLike) -> Transcoders:
    """Per-layer transcoders from circuit-tracer's YAML set (see the module doc)."""
    import numpy as np
    import yaml

    config_file = Path(config_file)
    config = yaml.safe_load(config_file.read_text(encoding="utf-8"))
    entries = config.get("transcoders") if isinstance(config, dict) else None
    if not entries:
        raise UserInputError(f"{config_file} lists no transcoders (a 'transcoders:' list of layer / filepath).")
    per_layer: dict[int, dict[str, Tensor]] = {}
    for entry in entries:
        path_text = str(entry["filepath"])
        if path_text.startswith("hf://"):
            raise UserInputError(f"{config_file}: {path_text} is on the Hub; vlens downloads nothing: fetch it "
                                 "(huggingface-cli download) and list the local file.")
        path = Path(path_text) if Path(path_text).is_absolute() else config_file.parent / path_text
        if not path.is_file():
            raise UserInputError(f"{config_file}: {path} does not exist.")
        if path.suffix == ".npz":
            with np.load(path) as params:
                weights = check_float_tensors({k: torch.tensor(params[k]) for k in params.files},
                                              f"the transcoder weights {path}")
        else:
            raw = load_float_tensors(path, "the transcoder weights")
            if raw.get("log_thresholds") is not None:
                raise UserInputError(f"{path}: log_thresholds in a ReLU transcoder file are not supported.")
            weights = {"W_enc": raw["W_enc"].T, "W_dec": raw["W_dec"].T, "b_enc": raw["b_enc"], "b_dec": raw["b_dec"]}
            if raw.get("W_skip") is not None:
                weights["W_skip"] = raw["W_skip"]  # applied as x @ W_skip.T
        per_layer[int(entry["layer"])] = weights
    kinds = {("jumprelu" if "threshold" in w else "relu", "W_skip" in w) for w in per_layer.values()}
    if len(kinds) != 1:
        raise UserInputError(f"{config_file}: the layers mix activations or skip connections; one set has one.")
    activation, has_skip = kinds.pop()
    first = per_layer[min(per_layer)]
    cfg = TranscoderConfig(kind="skip" if has_skip else "plt", activation=activation, layers=tuple(sorted(per_layer)),
                           d_model=int(first["W_enc"].shape[0]), d_tc=int(first["W_enc"].shape[1]),
                           metadata={"read_from": "circuit-tracer", "model_name": config.get("model_name"),
                                     "feature_input_hook": config.get("feature_input_hook"),
                                     "feature_output_hook": config.get("feature_output_hook")})
    state: dict[str, list[Tensor]] = {}
    for layer in cfg.layers:
        for key, value in per_layer[layer].items():
            state.setdefault(key, []).append(value.float())
    return _fill(Transcoders(cfg), state, skip_transposed=True, source=str(config_file))

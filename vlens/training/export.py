"""Adapters of a `HookedVLM` -> Hugging Face: peft adapter folder and merged checkpoint.

Our LoRA layers wrap the HF `nn.Linear` modules themselves, so each adapter's HF name is
found by identity (the HF module that *is* its base layer), for any family, e.g.
`blocks.3.attn.q_proj` -> `model.language_model.layers.3.self_attn.q_proj`.

- `save_adapters(model, dir)`: `adapter_config.json` + `adapter_model.safetensors` with HF
  names, so `PeftModel.from_pretrained(hf_model, dir)` loads them onto the plain HF model.
- `load_adapters(model, dir)`: the reverse, onto a `HookedVLM` (LoRA injected if needed).
- `save_merged(model, dir)`: W + scale * B A written into a copy of the HF state dict,
  `save_pretrained` format (plus the processor); the live model is not changed.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor

from vlens.training.lora import ADAPTER_NAME, add_lora, has_lora, lora_config, lora_layers
from vlens.utils.errors import UserInputError
from vlens.utils.fileio import atomic_folder

if TYPE_CHECKING:
    from vlens.core.model import HookedVLM


PEFT_PREFIX = "base_model.model."
ADAPTER_WEIGHTS = "adapter_model.safetensors"


def hf_names(model: HookedVLM) -> dict[str, str]:
    """Our LoRA module name -> the HF module name of its base layer."""
    by_id = {id(module): name for name, module in model.hf_model.named_modules()}
    names = {}
    for ours, layer in lora_layers(model).items():
        base = layer.get_base_layer()
        if id(base) not in by_id:
            raise RuntimeError(f"{ours}: its base layer is not a module of model.hf_model; cannot map it to HF")
        names[ours] = by_id[id(base)]
    return names


def _hf_config(model: HookedVLM, base_model_name_or_path: str | None):
    config = copy.deepcopy(lora_config(model))
    # exact HF names: a bare "q_proj" would also match e.g. a CLIP vision tower's projections
    config.target_modules = "|".join(re.escape(name) for name in sorted(hf_names(model).values()))
    config.base_model_name_or_path = base_model_name_or_path or getattr(model.cfg, "model_name", None) or None
    config.inference_mode = True
    return config


def adapter_state_dict(model: HookedVLM) -> dict[str, torch.Tensor]:
    """peft-format tensors with HF names: `base_model.model.<hf name>.lora_A.weight`, ..."""
    names = hf_names(model)
    out = {}
    for ours, layer in lora_layers(model).items():
        for part in ("lora_A", "lora_B"):
            weight = getattr(layer, part)[ADAPTER_NAME].weight
            out[f"{PEFT_PREFIX}{names[ours]}.{part}.weight"] = weight.detach().cpu().contiguous().clone()
    return out


def save_adapters(model: HookedVLM, folder: str | Path, base_model_name_or_path: str | None = None,
                  overwrite: bool = False) -> Path:
    """Write the adapters in peft format for the plain HF model; returns the folder.

    Written whole or not at all (`vlens.utils.fileio.atomic_folder`); replacing an existing adapter or
    model folder needs `overwrite`.
    """
    with atomic_folder(folder, overwrite=overwrite, name="adapter folder") as staging:
        save_file(adapter_state_dict(model), str(staging / ADAPTER_WEIGHTS), metadata={"format": "pt"})
        _hf_config(model, base_model_name_or_path).save_pretrained(str(staging))
    return Path(folder)


def load_adapters(model: HookedVLM, folder: str | Path):
    """Load a peft adapter folder saved for this model's HF architecture into a `HookedVLM`.

    Injects LoRA with the folder's rank/alpha/dropout when the model has none yet. Returns the model.
    """
    from peft import LoraConfig

    folder = Path(folder)
    if not (folder / ADAPTER_WEIGHTS).is_file():
        raise FileNotFoundError(f"{folder / ADAPTER_WEIGHTS} not found: is {folder} a peft adapter folder?")
    config = LoraConfig.from_pretrained(str(folder))
    tensors = load_file(str(folder / ADAPTER_WEIGHTS))
    hf_to_ours = _hf_module_to_ours(model)
    wanted: dict[str, dict[str, Tensor]] = {}
    for key, value in tensors.items():
        name = key.removeprefix(PEFT_PREFIX)
        module_name, _, part = name.rpartition(".lora_")
        if module_name not in hf_to_ours:
            raise UserInputError(
                f"adapter tensor {key} targets {module_name}, which is not a decoder attention "
                "projection of this model"
            )
        wanted.setdefault(hf_to_ours[module_name], {})[part.split(".")[0]] = value
    if not has_lora(model):
        layers = sorted({int(ours.split(".")[1]) for ours in wanted})
        projections = sorted({ours.rsplit(".", 1)[1] for ours in wanted})
        add_lora(
            model,
            rank=config.r,
            alpha=config.lora_alpha,
            dropout=config.lora_dropout,
            projections=projections,
            layers=layers,
        )
    lora = lora_layers(model)
    missing = set(lora) - set(wanted)
    if missing:
        raise UserInputError(f"the adapter folder has no weights for {sorted(missing)[:4]}...")
    with torch.no_grad():
        for ours, parts in wanted.items():
            for part, value in parts.items():
                weight = getattr(lora[ours], f"lora_{part}")[ADAPTER_NAME].weight
                weight.copy_(value.to(weight.device, weight.dtype))
    return model


def _hf_module_to_ours(model: HookedVLM) -> dict[str, str]:
    """HF decoder attention projection name -> our name (via the shared nn.Linear)."""
    by_id = {}
    for layer, block in enumerate(model.blocks):
        for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
            module = getattr(block.attn, proj, None)
            if module is None:  # a linear-attention (Gated DeltaNet) layer has none of them
                continue
            base = module.get_base_layer() if hasattr(module, "get_base_layer") else module
            by_id[id(base)] = f"blocks.{layer}.attn.{proj}"
    return {name: by_id[id(m)] for name, m in model.hf_model.named_modules() if id(m) in by_id}


def merged_state_dict(model: HookedVLM) -> dict[str, torch.Tensor]:
    """The HF model's state dict with every adapter merged: W + (alpha / r) * B @ A."""
    state = {k: v.detach() for k, v in model.hf_model.state_dict().items()}
    names = hf_names(model)
    with torch.no_grad():
        for ours, layer in lora_layers(model).items():
            key = f"{names[ours]}.weight"
            base = state[key]
            delta = layer.get_delta_weight(ADAPTER_NAME)
            state[key] = (base.float() + delta.float()).to(base.dtype).contiguous()
    return state


def save_merged(model: HookedVLM, folder: str | Path, save_processor: bool = True, overwrite: bool = False) -> Path:
    """A merged HF checkpoint (`from_pretrained` loads it with plain transformers).

    Written whole or not at all (`vlens.utils.fileio.atomic_folder`): a failure leaves an existing
    folder as it was; replacing an existing model folder needs `overwrite`.
    """
    with atomic_folder(folder, overwrite=overwrite, name="merged folder") as staging:
        _write_merged(model, staging, save_processor)
    return Path(folder)


def _write_merged(model: HookedVLM, folder: Path, save_processor: bool) -> None:
    model.hf_model.save_pretrained(str(folder), state_dict=merged_state_dict(model))
    processor = model.processor
    if save_processor and processor is not None and hasattr(processor, "save_pretrained"):
        try:
            processor.save_pretrained(str(folder))
        except Exception as err:  # noqa: BLE001 - weights are saved; say why the processor is not
            (folder / "PROCESSOR_NOT_SAVED.txt").write_text(f"processor.save_pretrained failed: {err!r}\n")
    info = {
        "merged_from": "vlens LoRA adapters",
        "lora": json.loads(lora_config(model).to_json_string())
        if hasattr(lora_config(model), "to_json_string")
        else str(lora_config(model)),
    }
    (folder / "vlens_merge.json").write_text(json.dumps(info, indent=2, default=str) + "\n")

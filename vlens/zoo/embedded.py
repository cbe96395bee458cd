"""The embedded default model: a tiny Qwen2.5-VL trained from scratch on the task suites.

`load()` returns it as a `HookedVLM`; `model_path()` is its folder, a normal Hugging Face
model folder (config, safetensors, tokenizer, processor, MODEL_CARD.md) that plain
`transformers` loads too; `vlens.zoo.processor` builds and loads its processor. The recipe
that trains it lives outside the library proper, in `vlens.recipes.embedded`
(`vlens zoo train --out DIR --seed S`; the model card lists the exact commands).
"""

from __future__ import annotations

from pathlib import Path

from transformers import Qwen2_5_VLForConditionalGeneration

from vlens.core.loading import from_pretrained_checked
from vlens.core.model import HookedVLM
from vlens.zoo.image_sizes import MODEL_NAME, WEIGHTS_FOLDER
from vlens.zoo.processor import load_processor


def model_path() -> Path:
    """Folder of the shipped model (raises FileNotFoundError if the weights are missing)."""
    if not (WEIGHTS_FOLDER / "model.safetensors").is_file():
        raise FileNotFoundError(
            f"the embedded model is missing from {WEIGHTS_FOLDER}; rebuild it with "
            f"`vlens zoo train --out {WEIGHTS_FOLDER}`"
        )
    return WEIGHTS_FOLDER


def load(device=None, dtype=None, **kwargs):
    """The embedded model as a `vlens.HookedVLM` on `device` in `dtype` (default: cuda when
    available, else cpu; bf16 on a GPU, fp32 on the CPU; see `vlens.core.devices`)."""
    return HookedVLM.from_pretrained(str(model_path()), device=device, dtype=dtype, **kwargs)


def is_embedded(model) -> bool:
    """Whether ``model`` (a HookedVLM or an HF model) was loaded from the embedded model's folder."""
    hf_model = getattr(model, "hf_model", model)
    name = getattr(getattr(hf_model, "config", None), "_name_or_path", "") or ""
    try:
        return bool(name) and Path(name).resolve() == WEIGHTS_FOLDER
    except OSError:
        return False


def load_hf(device=None, dtype=None):
    """The embedded model with plain transformers: (Qwen2_5_VLForConditionalGeneration, processor)."""
    folder = model_path()
    model = from_pretrained_checked(Qwen2_5_VLForConditionalGeneration, folder, dtype=dtype)
    if device is not None:
        model = model.to(device)
    return model.eval(), load_processor(folder)


__all__ = ["MODEL_NAME", "WEIGHTS_FOLDER", "is_embedded", "load", "load_hf", "model_path"]

"""Every family's tiny random model, by name: the registry the tests, `vlens tiny` and `write_tiny_folder` share.

    hf, processor = tiny_parts("llava", n_layers=3, d_model=48)     # an HF model and its processor
    write_tiny_folder("gemma3", "tiny-gemma3/")                    # a model folder HookedVLM and HF load

A family's builders are found by name: ``tiny_<family>_model`` and ``tiny_<family>_processor`` in
``vlens.testing.<family>``, so a new family's tiny model is here as soon as its module is (the
families whose builders are named otherwise are listed in `TINY_FAMILIES`; `register_tiny_family`
adds one). A model builder takes ``seed=``, ``attn_implementation=``, ``tokenizer=`` and config
sizes; the sizes its processor builder also names (a patch size, a tiling) go to the processor too,
so the two agree. `tests/unit/test_tiny_folders.py` checks that every family vlens's adapter registry
runs has one. Nothing is downloaded (docs/tiny-models.md).
"""

from __future__ import annotations

import importlib
import inspect
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from vlens.core.architectures.registry import registered_adapters
from vlens.testing.glm4v import tiny_glm4v_moe_model, tiny_glm4v_processor
from vlens.testing.idefics3 import tiny_smolvlm_model, tiny_smolvlm_processor
from vlens.testing.llava_next import tiny_llava_onevision_model, tiny_llava_onevision_processor
from vlens.testing.qwen import (
    tiny_hf_model,
    tiny_qwen3_vl_model,
    tiny_qwen3_vl_processor,
    tiny_qwen_processor,
)
from vlens.testing.qwen3_5 import tiny_qwen3_5_model
from vlens.testing.qwen3_5_moe import tiny_qwen3_5_moe_model
from vlens.testing.qwen3_vl_moe import tiny_qwen3_vl_moe_model
from vlens.utils.errors import UserInputError

__all__ = ["TINY_FAMILIES", "TinyFamily", "register_tiny_family", "tiny_families", "tiny_family", "tiny_parts",
           "write_tiny_folder"]


@dataclass(frozen=True)
class TinyFamily:
    """How to build one family's tiny random model and its processor.

    Attributes:
        model: builds the HF model: ``model(seed=, attn_implementation=, [tokenizer=], **sizes)``.
        processor: builds its processor: ``processor([tokenizer=], **shared sizes, **options)``; the sizes
            it names as parameters are passed to it too.
    """

    model: Callable[..., Any]
    processor: Callable[..., Any]

    def shared(self, sizes: dict[str, Any]) -> dict[str, Any]:
        """The sizes the processor builder takes as well."""
        named = inspect.signature(self.processor).parameters
        return {key: value for key, value in sizes.items() if key in named and key != "tokenizer"}


def _qwen2(family: str) -> Callable[..., Any]:
    def build(**kwargs: Any) -> Any:
        return tiny_hf_model(family, **kwargs)
    build.__wrapped__ = tiny_hf_model  # type: ignore[attr-defined]  # where its config builder lives
    return build


def _unknown_sizes(entry: TinyFamily, hf: Any, sizes: dict[str, Any]) -> list[str]:
    """The sizes neither the family's builders name nor its HF configs have (HF configs keep any keyword
    silently, so a misspelt size would otherwise be lost)."""
    builder = inspect.unwrap(entry.model)
    module = sys.modules[builder.__module__]
    functions = [builder, *(getattr(module, n) for n in dir(module) if n.startswith("tiny_") and n.endswith("_config"))]
    known = {p.name for f in functions for p in inspect.signature(f).parameters.values()
             if p.kind not in (inspect.Parameter.VAR_KEYWORD, inspect.Parameter.VAR_POSITIONAL)}
    for config in (hf.config, getattr(hf.config, "text_config", None), getattr(hf.config, "vision_config", None)):
        if config is not None:
            known |= set(type(config)().to_dict())
    return [key for key in sizes if key not in known]


# the families whose builders are not tiny_<family>_model / _processor in vlens.testing.<family>
TINY_FAMILIES: dict[str, TinyFamily] = {
    "qwen2_vl": TinyFamily(_qwen2("qwen2_vl"), tiny_qwen_processor),
    "qwen2_5_vl": TinyFamily(_qwen2("qwen2_5_vl"), tiny_qwen_processor),
    "qwen3_vl": TinyFamily(tiny_qwen3_vl_model, tiny_qwen3_vl_processor),
    "qwen3_vl_moe": TinyFamily(tiny_qwen3_vl_moe_model, tiny_qwen3_vl_processor),
    "qwen3_5": TinyFamily(tiny_qwen3_5_model, tiny_qwen3_vl_processor),
    "qwen3_5_moe": TinyFamily(tiny_qwen3_5_moe_model, tiny_qwen3_vl_processor),
    "llava_onevision": TinyFamily(tiny_llava_onevision_model, tiny_llava_onevision_processor),
    "smolvlm": TinyFamily(tiny_smolvlm_model, tiny_smolvlm_processor),
    "glm4v_moe": TinyFamily(tiny_glm4v_moe_model, tiny_glm4v_processor),
}


def tiny_family(name: str) -> TinyFamily | None:
    """`name`'s builders: listed in TINY_FAMILIES, or found by their names; None when it has none."""
    if name in TINY_FAMILIES:
        return TINY_FAMILIES[name]
    try:
        module = importlib.import_module(f"vlens.testing.{name}")
    except ModuleNotFoundError:
        return None
    model, processor = (getattr(module, f"tiny_{name}_{part}", None) for part in ("model", "processor"))
    return TinyFamily(model, processor) if callable(model) and callable(processor) else None


def tiny_families() -> list[str]:
    """Every family with a tiny model: the adapter registry's (refused ones aside) and TINY_FAMILIES'."""
    names = [name for name, adapter in registered_adapters().items() if getattr(adapter, "refusal", None) is None]
    names += [name for name in TINY_FAMILIES if name not in names]
    return [name for name in names if tiny_family(name) is not None]


def register_tiny_family(name: str, family: TinyFamily) -> None:
    """Add (or replace) a family's tiny builders."""
    TINY_FAMILIES[name] = family


def tiny_parts(family: str, seed: int = 0, attn: str = "eager", processor: dict | None = None,
               tokenizer: Any = None, **sizes: Any) -> tuple[Any, Any]:
    """A new (HF model, processor) of `family`'s tiny random model: `sizes` go to its config (the ones the
    processor shares to the processor too), `processor` to the processor builder, `tokenizer` to both."""
    entry = tiny_family(family)
    if entry is None:
        raise UserInputError(f"no tiny model of the family {family!r}: choose one of {', '.join(tiny_families())}")
    options = {"tokenizer": tokenizer} if tokenizer is not None else {}
    hf = entry.model(seed=seed, attn_implementation=attn, **options, **sizes)
    return hf, entry.processor(**options, **{**entry.shared(sizes), **(processor or {})})


def write_tiny_folder(family: str, path: str | Path, seed: int = 0, processor: dict | None = None,
                      **sizes: Any) -> Path:
    """Write `family`'s tiny random model as a model folder: the HF config, `model.safetensors`, the
    processor's and tokenizer's files, and `tiny.json` (family, seed, sizes). The folder loads with
    `HookedVLM.from_pretrained(path)` and with the family's HF class (``from_pretrained``), logits equal.

    `sizes` are config sizes of the family's builder (e.g. ``n_layers=3, d_model=48``; see
    `vlens.testing.<family>`); `processor` options of its processor builder. Refuses a `path` that
    holds files already. Returns the folder.
    """
    folder = Path(path)
    if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
        raise UserInputError(f"{folder} is not an empty folder: write the tiny model to a new folder")
    try:
        hf, made = tiny_parts(family, seed=seed, processor=processor, **sizes)
    except TypeError as error:  # a size the family's builder does not take
        raise UserInputError(f"the tiny {family} model takes no such size: {error} (see vlens.testing's "
                             f"tiny_{family} builders)") from None
    unknown = _unknown_sizes(tiny_family(family), hf, sizes)  # type: ignore[arg-type]
    if unknown:
        raise UserInputError(f"the tiny {family} model takes no such size: {', '.join(unknown)} (neither its "
                             f"builders in vlens.testing nor its HF config have it)")
    folder.mkdir(parents=True, exist_ok=True)
    hf.config.torch_dtype = torch.float32
    hf.save_pretrained(folder, safe_serialization=True)
    made.save_pretrained(str(folder))
    (folder / "tiny.json").write_text(json.dumps({"family": family, "seed": seed, "sizes": sizes,
                                                  "processor": processor or {}}, indent=1, default=str) + "\n")
    return folder

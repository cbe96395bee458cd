"""Loading HF checkpoints safely: safetensors only, no remote code unless asked."""

from __future__ import annotations

import logging
import os
from typing import Any

import torch
import transformers

from vlens.core.architectures import ArchitectureAdapter, resolve_adapter
from vlens.core.processors import SimpleVLProcessor
from vlens.utils.errors import UserInputError

logger = logging.getLogger(__name__)

_PROCESSOR_FILES = ("preprocessor_config.json", "processor_config.json", "tokenizer_config.json",
                    "tokenizer.json")


class MissingWeightsError(UserInputError):
    """A checkpoint lacks tensors the model needs (HF would initialise them randomly)."""


def from_pretrained_checked(hf_class: Any, name_or_path: str, allow_missing: bool = False, **kwargs: Any):
    """`hf_class.from_pretrained(...)`, but a checkpoint missing any of the model's tensors is an
    error (HF only logs it and fills them with random values) unless `allow_missing`."""
    model, info = hf_class.from_pretrained(name_or_path, output_loading_info=True, **kwargs)
    missing = sorted(info.get("missing_keys") or [])
    if missing and not allow_missing:
        shown = ", ".join(missing[:5]) + (f" (+{len(missing) - 5} more)" if len(missing) > 5 else "")
        raise MissingWeightsError(
            f"{name_or_path}: the checkpoint has no weights for {len(missing)} tensor(s) of the model: {shown}. "
            "They would be random. Use a complete checkpoint, or pass allow_missing=True to accept random values."
        )
    if missing:
        logger.warning("%s: %d tensor(s) missing from the checkpoint are randomly initialised (allow_missing=True)",
                       name_or_path, len(missing))
    return model


def load_hf_model_and_processor(name_or_path: str, dtype: torch.dtype | None = None,
                                trust_remote_code: bool = False, load_processor: bool = True,
                                allow_missing: bool = False,
                                adapter: ArchitectureAdapter | type[ArchitectureAdapter] | str | None = None,
                                **hf_kwargs: Any):
    """(hf_model, processor or None) from a local folder or hub id.

    The architecture is checked from the config before any weight is read, so an unsupported
    model fails fast with the list of supported ones; `adapter` (an adapter, its class or a
    registered family name) overrides the registered one. A checkpoint that lacks some of the
    model's tensors raises `MissingWeightsError` unless `allow_missing`.
    """
    config = transformers.AutoConfig.from_pretrained(name_or_path, trust_remote_code=trust_remote_code)
    architectures = getattr(config, "architectures", None) or []
    if not architectures:
        raise ValueError(f"{name_or_path}: config.json names no 'architectures'; cannot tell which model to build.")
    class_name = architectures[0]
    # an unsupported family fails here, before any weight is read
    family = resolve_adapter(adapter, class_name)
    hf_class = family.hf_model_class(class_name)
    hf_kwargs.setdefault("use_safetensors", True)  # never unpickle weights
    if dtype is not None:
        hf_kwargs["dtype"] = dtype
    hf_model = from_pretrained_checked(hf_class, name_or_path, allow_missing=allow_missing,
                                       trust_remote_code=trust_remote_code, **hf_kwargs)
    hf_model.eval()
    processor = None
    if load_processor:
        is_local = os.path.isdir(name_or_path)
        has_files = not is_local or any(os.path.exists(os.path.join(name_or_path, f)) for f in _PROCESSOR_FILES)
        if has_files:
            processor = load_processor_for(name_or_path, trust_remote_code=trust_remote_code, adapter=family)
    return hf_model, processor


def load_processor_for(name_or_path: str, trust_remote_code: bool = False,
                       adapter: ArchitectureAdapter | None = None):
    """HF's AutoProcessor, or, where it cannot be built (its video processor needs torchvision), the
    family's own (`adapter.load_processor`, e.g. LLaVA-OneVision's image-only processor), else a
    `SimpleVLProcessor` from the folder's tokenizer and image processor."""
    try:
        processor = transformers.AutoProcessor.from_pretrained(name_or_path, trust_remote_code=trust_remote_code)
        if hasattr(processor, "tokenizer") and hasattr(processor, "image_processor"):
            return processor
    except (ImportError, AttributeError, ValueError, TypeError, OSError) as error:
        logger.info("AutoProcessor unavailable for %s (%s); using a fallback processor", name_or_path, error)
    own = adapter.load_processor(name_or_path, trust_remote_code=trust_remote_code) if adapter is not None else None
    if own is not None:
        return own

    tokenizer = transformers.AutoTokenizer.from_pretrained(name_or_path, trust_remote_code=trust_remote_code)
    image_processor = transformers.AutoImageProcessor.from_pretrained(name_or_path,
                                                                      trust_remote_code=trust_remote_code)
    chat_template = None
    template_file = os.path.join(name_or_path, "chat_template.jinja")
    if os.path.exists(template_file):
        with open(template_file) as fh:
            chat_template = fh.read()
    return SimpleVLProcessor(tokenizer, image_processor, chat_template=chat_template)

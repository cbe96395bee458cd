"""Loading HF checkpoints safely: safetensors only, a local folder validated whole first, no remote
code unless asked, a hub id that cannot be reached failing in seconds."""

from __future__ import annotations

import logging
import os
from typing import Any

import torch
import transformers

from vlens.core.architectures import ArchitectureAdapter, resolve_adapter
from vlens.core.hub import DOWNLOAD_HINT, HUB_TIMEOUT_S, HubUnreachableError, check_hub_reachable
from vlens.core.model_folder import (
    SAME_CONFIG,
    MissingWeightsError,
    ModelFolderError,
    check_processor,
    load_processor_for,
    validate_model_folder,
)
from vlens.utils.errors import UserInputError, failure_context

logger = logging.getLogger(__name__)

_PROCESSOR_FILES = ("preprocessor_config.json", "processor_config.json", "tokenizer_config.json",
                    "tokenizer.json")
def from_pretrained_checked(hf_class: Any, name_or_path: str, allow_missing: bool = False, **kwargs: Any):
    """`hf_class.from_pretrained(...)`, but a checkpoint missing any of the model's tensors is an
    error (HF only logs it and fills them with random values) unless `allow_missing`, and so are
    tensors the model does not use (HF drops them: a config with fewer layers than the weights)
    and tensors of another shape."""
    model, info = hf_class.from_pretrained(name_or_path, output_loading_info=True, **kwargs)
    missing = sorted(info.get("missing_keys") or [])
    unexpected = sorted(info.get("unexpected_keys") or [])
    mismatched = list(info.get("mismatched_keys") or [])
    if mismatched:
        raise ModelFolderError(f"{name_or_path}: {len(mismatched)} tensor(s) of the weights have another shape than the "
                               f"config makes, e.g. {mismatched[0]}: {SAME_CONFIG}")
    if unexpected:
        raise ModelFolderError(f"{name_or_path}: the weights hold {len(unexpected)} tensor(s) the config does not use, "
                               f"e.g. {unexpected[0]}; they would be silently dropped: {SAME_CONFIG}")
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

    A local folder is checked whole first (`vlens.core.model_folder.validate_model_folder`: config,
    architecture, every weight file's header against the config, tokenizer and image token), so a
    broken folder fails in one line before any weight is read. A hub id is checked to be reachable
    (or cached) within seconds (`check_hub_reachable`). `adapter` (an adapter, its class or a
    registered family name) overrides the registered one. A checkpoint that lacks some of the
    model's tensors raises `MissingWeightsError` unless `allow_missing`.
    """
    hf_kwargs.setdefault("use_safetensors", True)  # never unpickle weights
    if dtype is not None:
        hf_kwargs["dtype"] = dtype
    if os.path.isdir(name_or_path):
        folder = validate_model_folder(name_or_path, load_processor=load_processor and _has_processor_files(
            name_or_path), allow_missing=allow_missing, adapter=adapter, trust_remote_code=trust_remote_code)
        with failure_context(f"loading the weights of {name_or_path}", SAME_CONFIG):
            hf_model = from_pretrained_checked(folder.hf_class, name_or_path, allow_missing=allow_missing,
                                               trust_remote_code=trust_remote_code, **hf_kwargs)
        hf_model.eval()
        return hf_model, folder.processor

    if os.path.exists(name_or_path):  # before: the Hub's "Repo id must be in the form 'namespace/repo_name'"
        raise UserInputError(f"{name_or_path} is a file, not a model folder: pass the folder that holds config.json "
                             "and the weights")
    if str(name_or_path).startswith((".", "/", "~")) or str(name_or_path).count("/") >= 2:
        raise UserInputError(f"model folder {name_or_path} does not exist ({os.path.abspath(name_or_path)}): check the "
                             "path (a hub id is org/name)")
    if check_hub_reachable(name_or_path):
        hf_kwargs.setdefault("local_files_only", True)
    local_only = {"local_files_only": True} if hf_kwargs.get("local_files_only") else {}
    fix = f"check the hub id and the network, or {DOWNLOAD_HINT.format(repo=name_or_path)}"
    with failure_context(f"loading {name_or_path} from the Hugging Face Hub", fix):
        config = transformers.AutoConfig.from_pretrained(name_or_path, trust_remote_code=trust_remote_code,
                                                         **local_only)
        architectures = getattr(config, "architectures", None) or []
        if not architectures:
            raise UserInputError(f"{name_or_path}: config.json names no 'architectures'; cannot tell which model to "
                                 "build.")
        class_name = architectures[0]
        # an unsupported family fails here, before any weight is read
        family = resolve_adapter(adapter, class_name)
        hf_class = family.hf_model_class(class_name)
        hf_model = from_pretrained_checked(hf_class, name_or_path, allow_missing=allow_missing,
                                           trust_remote_code=trust_remote_code, **hf_kwargs)
        hf_model.eval()
        processor = None
        if load_processor:
            processor = load_processor_for(name_or_path, trust_remote_code=trust_remote_code, adapter=family)
            check_processor(processor, config, name_or_path)
    return hf_model, processor


def _has_processor_files(folder: str) -> bool:
    return any(os.path.exists(os.path.join(folder, name)) for name in _PROCESSOR_FILES)


__all__ = ["HUB_TIMEOUT_S", "HubUnreachableError", "MissingWeightsError", "ModelFolderError",
           "check_hub_reachable", "from_pretrained_checked", "load_hf_model_and_processor", "load_processor_for",
           "validate_model_folder"]

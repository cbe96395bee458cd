"""A local model folder checked whole before any weight is read: `validate_model_folder(path)`.

`HookedVLM.from_pretrained` (and every `vlens` command, before it starts) calls it on local
folders. Each problem is one `ModelFolderError` (a `UserInputError`) naming the file and how to fix it:

| check | refused |
|---|---|
| the folder | missing, not a folder, unreadable (a permission error is said as one), a symbolic-link loop |
| config.json | missing, unreadable, not JSON, a key given twice, no ``model_type``, ``architectures`` missing or of no registered family |
| weights | pickle files only (``.bin``, ``.pt``; never unpickled: how to convert), no weights, a shard the index names missing, a truncated or garbage safetensors file (read from its header) |
| config vs weights | a weight stored as integers or booleans (not floating point), a tensor the model needs is absent (`MissingWeightsError`, unless ``allow_missing``), a tensor the config does not use (e.g. weights with more layers than ``num_hidden_layers``), a shape that differs (a width that does not match) |
| tokenizer / processor | no tokenizer files, token ids past the embedding's rows, an image token the tokenizer does not know or that is not the config's ``image_token_id``, a chat template that does not parse |

Config and weights are compared on a model built on the meta device (no memory) with the
checkpoint's names mapped as transformers maps them when it loads (old and new key layouts
both work); only the safetensors headers are read. A folder that passed is remembered (by its
files' sizes and times), so checking it again costs nothing.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import transformers

from vlens.core.architectures import registered_adapters, resolve_adapter
from vlens.core.processors import SimpleVLProcessor
from vlens.core.weight_files import ModelFolderError, TensorInfo, os_error_message, weight_tensors
from vlens.utils.errors import UserInputError, failure_context
from vlens.utils.strict_json import loads_strict

logger = logging.getLogger(__name__)

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "vocab.txt",
                   "spiece.model")
SAME_CONFIG = "use the config.json that came with these weights (or weights saved from this config)"
_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


class MissingWeightsError(ModelFolderError):
    """A checkpoint lacks tensors the model needs (HF would initialise them randomly)."""


@dataclass
class ModelFolder:
    """What `validate_model_folder` found: the config, the HF class it names, the weights' tensors
    and (when asked) the processor, already checked against the config."""

    path: Path
    config: Any
    class_name: str
    hf_class: type
    tensors: dict[str, TensorInfo] = field(repr=False)
    processor: Any = field(default=None, repr=False)


_validated: dict[tuple, tuple[Any, str, Any, type, dict[str, TensorInfo]]] = {}


def validate_model_folder(path: str | os.PathLike, *, load_processor: bool = True, allow_missing: bool = False,
                          adapter: Any = None, trust_remote_code: bool = False) -> ModelFolder:
    """Check a local model folder whole (see the module doc); raise `ModelFolderError` on the first problem.

    load_processor: also load the tokenizer / processor and check it against the config (it is
        returned in `ModelFolder.processor`); False checks config and weights only.
    allow_missing: accept weights that lack some of the model's tensors (they would be random).
    adapter: the family's adapter (instance, class or family name) instead of the registered one.
    """
    folder = Path(path)
    _check_folder(folder)
    key = (str(folder.resolve()), _signature(folder), allow_missing, repr(adapter))
    if key in _validated:
        config, class_name, family, hf_class, tensors = _validated[key]
    else:
        raw = read_config(folder)
        class_name = architecture(raw, folder)
        try:
            family = resolve_adapter(adapter, class_name)
            hf_class = family.hf_model_class(class_name)
        except UserInputError as error:
            raise ModelFolderError(f"{folder / 'config.json'}: {error}") from None
        tensors = weight_tensors(folder)
        with failure_context(f"reading {folder / 'config.json'}", SAME_CONFIG):
            config = transformers.AutoConfig.from_pretrained(str(folder), trust_remote_code=trust_remote_code)
        compare_with_config(hf_class, config, tensors, folder, allow_missing=allow_missing)
        _validated[key] = (config, class_name, family, hf_class, tensors)
    result = ModelFolder(folder, config, class_name, hf_class, tensors)
    if load_processor:
        present = [name for name in TOKENIZER_FILES if (folder / name).is_file()]
        if not present:
            raise ModelFolderError(f"{folder}: no tokenizer ({', '.join(TOKENIZER_FILES[:2])}, ...): copy the tokenizer "
                                   "and processor files of the original model into the folder, or load the weights "
                                   "alone with load_processor=False")
        result.processor = load_processor_for(str(folder), trust_remote_code=trust_remote_code, adapter=family)
        check_processor(result.processor, config, folder, tensors)
    return result


def _check_folder(folder: Path) -> None:
    try:
        info = folder.stat()
    except FileNotFoundError:
        raise ModelFolderError(f"model folder {folder}: no such folder") from None
    except OSError as error:
        raise ModelFolderError(f"model folder {os_error_message(error, folder, 'open')}") from None
    if not os.path.isdir(folder) or not info.st_mode & 0o040000:
        raise ModelFolderError(f"model {folder} is a file; pass the model folder (with config.json)")
    try:
        os.listdir(folder)
    except OSError as error:
        raise ModelFolderError(os_error_message(error, folder, "list")) from None


def _signature(folder: Path) -> tuple:
    """The folder's files (name, size, mtime): a changed file is checked again."""
    entries: list[tuple] = []
    for entry in sorted(os.scandir(folder), key=lambda e: e.name):
        try:
            stat = entry.stat()
        except OSError:
            entries.append((entry.name, None))
            continue
        entries.append((entry.name, stat.st_size, stat.st_mtime_ns))
    return tuple(entries)


def read_config(folder: Path) -> dict:
    """config.json as a dict: present, readable, JSON without repeated keys, with a model_type."""
    path = folder / "config.json"
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        if path.is_symlink():
            raise ModelFolderError(f"{path} is a symbolic link to a missing file: fix or remove the link") from None
        raise ModelFolderError(f"model folder {folder} holds no config.json; is it a Hugging Face model folder?") \
            from None
    except UnicodeDecodeError as error:
        raise ModelFolderError(f"{path} is not UTF-8 text ({error.reason}): save it as UTF-8") from None
    except OSError as error:
        raise ModelFolderError(os_error_message(error, path)) from None
    try:
        config = loads_strict(text, str(path))
    except json.JSONDecodeError as error:
        raise ModelFolderError(f"{path} line {error.lineno}: not valid JSON ({error.msg}): fix the file") from None
    except UserInputError as error:
        raise ModelFolderError(str(error)) from None
    if not isinstance(config, dict) or not config.get("model_type"):
        raise ModelFolderError(f"{path} names no model_type; is it a Hugging Face model folder? (the config of the "
                               "original model has one, e.g. \"model_type\": \"qwen2_5_vl\")")
    return config


def architecture(config: dict, folder: Path) -> str:
    """The HF class config.json's ``architectures`` names; a missing one is an error that suggests a class."""
    names = config.get("architectures")
    where = folder / "config.json"
    if not names:
        guess = _class_for_model_type(str(config.get("model_type")))
        hint = f'add "architectures": ["{guess}"]' if guess else "add the model's class name as \"architectures\""
        raise ModelFolderError(f"{where} names no 'architectures', so the model class is unknown: {hint} "
                               "(as in the original model's config.json)")
    if not isinstance(names, list) or not all(isinstance(name, str) for name in names):
        raise ModelFolderError(f"{where}: 'architectures' must be a list of class names, got {names!r}")
    return names[0]


def _class_for_model_type(model_type: str) -> str | None:
    for adapter in registered_adapters().values():
        for name in adapter.hf_class_names:
            hf_class = getattr(transformers, name, None)
            config_class = getattr(hf_class, "config_class", None)
            if getattr(config_class, "model_type", None) == model_type:
                return name
    return None


def compare_with_config(hf_class: type, config: Any, tensors: dict[str, TensorInfo], folder: Path,
                        allow_missing: bool = False) -> None:
    """Every tensor the model built from `config` needs is in the weights with its shape, and every
    tensor of the weights is used. The model is built on the meta device; checkpoint names are mapped
    with transformers' own renamings. Skipped (with a debug line) where transformers lacks them."""
    try:
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import WeightConverter, WeightRenaming, rename_source_key
    except ImportError as error:  # another transformers: the loading info is checked after loading
        logger.debug("not comparing %s with its config before loading: %s", folder, error)
        return
    try:
        with torch.device("meta"), failure_context(f"building the model {folder} describes", SAME_CONFIG):
            model = hf_class(config)
    except UserInputError:
        raise
    except Exception as error:  # the real load reports it, with transformers' own message
        logger.debug("cannot build %s on the meta device (%s); compared after loading", hf_class.__name__, error)
        return
    expected = {name: tuple(tensor.shape) for name, tensor in model.state_dict().items()}
    transforms = get_model_conversion_mapping(model)
    renamings = [t for t in transforms if isinstance(t, WeightRenaming)]
    converters = [t for t in transforms if isinstance(t, WeightConverter)]
    mapped: dict[str, list[str]] = {}
    converted: set[str] = set()
    for key in tensors:
        name, pattern = rename_source_key(key, renamings, converters, model.base_model_prefix, expected)
        mapped.setdefault(name, []).append(key)
        if pattern is not None:
            converted.add(name)
            # a converter that splits one tensor into several (Molmo 2's fused q/k/v, gate/up) fills them all
            for sibling in _split_targets(name, converters):
                mapped.setdefault(sibling, []).append(key)
                converted.add(sibling)
    tied = set(getattr(model, "all_tied_weights_keys", None) or ())
    unused = sorted(key for name, keys in mapped.items() if name not in expected
                    and not _matches(name, model._keys_to_ignore_on_load_unexpected) for key in keys)
    missing = sorted(name for name in expected if name not in mapped and name not in tied
                     and not _matches(name, model._keys_to_ignore_on_load_missing))
    parameters = {name for name, _ in model.named_parameters(remove_duplicate=False)}
    not_float = [key for name, keys in sorted(mapped.items()) if name in parameters for key in keys
                 if not _is_float(tensors[key].dtype)]
    if not_float:  # transformers would cast them to the load dtype without a word
        info = tensors[not_float[0]]
        raise ModelFolderError(
            f"{folder}: {len(not_float)} weight(s) are not floating point, e.g. {not_float[0]} is stored as "
            f"{info.dtype} in {info.file}: vlens runs float weights only (a quantised or corrupted checkpoint would be "
            "silently cast); use the original float16 / bfloat16 / float32 checkpoint")
    wrong = [(keys[0], tensors[keys[0]], expected[name]) for name, keys in sorted(mapped.items())
             if name in expected and name not in converted and len(keys) == 1
             and tensors[keys[0]].shape != expected[name]]
    if wrong:
        key, info, shape = wrong[0]
        raise ModelFolderError(
            f"{folder / 'config.json'} does not match the weights: {len(wrong)} tensor(s) have other shapes than the "
            f"config makes, e.g. {key} is {list(info.shape)} in {info.file} but {list(shape)} for this config "
            f"({_sizes(config)}): {SAME_CONFIG}")
    if unused:
        raise ModelFolderError(
            f"{folder}: the weights hold {len(unused)} tensor(s) the config does not use, e.g. {unused[0]} "
            f"{_layer_note(tensors, config)}; they would be silently dropped: {SAME_CONFIG}")
    if missing and not allow_missing:
        shown = ", ".join(missing[:5]) + (f" (+{len(missing) - 5} more)" if len(missing) > 5 else "")
        raise MissingWeightsError(
            f"{folder}: the checkpoint has no weights for {len(missing)} tensor(s) of the model: {shown}. They "
            "would be random. Use a complete checkpoint, or pass allow_missing=True to accept random values.")
    if missing:
        logger.warning("%s: %d tensor(s) missing from the checkpoint will be random (allow_missing=True)", folder,
                       len(missing))


def _is_float(dtype: str) -> bool:
    """A safetensors dtype name that is floating point (F16, BF16, F32, F64, F8_*)."""
    return dtype.startswith("F") or dtype == "BF16"


def _split_targets(name: str, converters: list) -> list[str]:
    """The other tensors a splitting converter writes besides `name` (its targets, one of which `name` holds)."""
    out = []
    for converter in converters:
        targets = [str(t) for t in getattr(converter, "target_patterns", None) or []]
        if len(targets) < 2:
            continue
        for target in targets:
            if target in name:
                out += [name.replace(target, other) for other in targets if other != target]
                break
    return out


def _matches(name: str, patterns: Iterable[str] | None) -> bool:
    return any(re.search(pattern, name) for pattern in patterns or ())


def _sizes(config: Any) -> str:
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    fields = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "vocab_size")
    return ", ".join(f"{name}={getattr(text, name)}" for name in fields if getattr(text, name, None) is not None)


def _layer_note(tensors: dict[str, TensorInfo], config: Any) -> str:
    layers = {int(m.group(1)) for key in tensors if "visual" not in key and "vision" not in key
              and (m := _LAYER.search(key))}
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    n_config = getattr(text, "num_hidden_layers", None)
    if layers and n_config is not None and max(layers) + 1 > n_config:
        return f"(the weights have {max(layers) + 1} language layers, config.json's num_hidden_layers is {n_config})"
    return ""


def vocab_rows(config: Any, tensors: dict[str, TensorInfo] | None = None) -> int | None:
    """The number of token embeddings: the config's text vocab_size (+ Molmo 2's additional_vocab_size, rows the
    embedding holds past the LM head's outputs)."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    size = getattr(text, "vocab_size", None)
    return int(size) + int(getattr(text, "additional_vocab_size", 0) or 0) if size is not None else None


def image_token_id(config: Any) -> int | None:
    for name in ("image_token_id", "image_token_index"):
        value = getattr(config, name, None)
        if value is not None:
            return int(value)
    return None


def check_processor(processor: Any, config: Any, folder: Path | str, tensors: dict | None = None) -> None:
    """The tokenizer fits the model: its ids lie within the embedding, the processor's image
    placeholder is the config's image token, the chat template parses."""
    tokenizer = getattr(processor, "tokenizer", processor)
    rows = vocab_rows(config)
    vocab = tokenizer.get_vocab() if hasattr(tokenizer, "get_vocab") else {}
    if rows is not None and vocab:
        largest = max(vocab.values())
        if largest >= rows:
            token = next(t for t, i in vocab.items() if i == largest)
            raise ModelFolderError(
                f"{folder}: the tokenizer has token ids up to {largest} ({token!r}) but the model embeds only {rows} tokens (ids 0..{rows - 1}; "
                "vocab_size in config.json): the tokenizer belongs to another model: copy this model's own tokenizer "
                "files (tokenizer.json, tokenizer_config.json)")
    wanted = image_token_id(config)
    if rows is not None and wanted is not None and not 0 <= wanted < rows:
        raise ModelFolderError(f"{Path(folder) / 'config.json'}: image_token_id {wanted} is outside the vocabulary "
                               f"(0..{rows - 1}): set it to the id of the image placeholder token")
    placeholder = getattr(processor, "image_token", None)
    if isinstance(placeholder, str) and wanted is not None and vocab:
        got = vocab.get(placeholder)
        # Aya Vision's "<image>" is text the processor replaces with its image tokens, never a token itself
        if got is None and not _expands_to(processor, placeholder, wanted):
            raise ModelFolderError(
                f"{folder}: the processor's image placeholder {placeholder!r} is not a token of the tokenizer, so "
                "images would have no place in the prompt: add it to the tokenizer (tokenizer.json added_tokens) "
                "or use the model's own tokenizer files")
        if got is not None and got != wanted and not _expands_to(processor, placeholder, wanted):
            raise ModelFolderError(
                f"{folder}: the processor's image placeholder {placeholder!r} is token {got}, but config.json's "
                f"image_token_id is {wanted}: the model would find no image tokens in the prompt: set image_token_id "
                f"to {got} (or use the tokenizer that came with the model)")
    template = getattr(processor, "chat_template", None) or getattr(tokenizer, "chat_template", None)
    if isinstance(template, str):
        _check_template(template, folder)


def _expands_to(processor: Any, placeholder: str, token_id: int) -> bool:
    """Whether the processor expands `placeholder` with one image into tokens that include `token_id`
    (Gemma 3 writes <start_of_image>, which becomes image soft tokens; Aya Vision replaces the text "<image>").
    Asked only when the placeholder itself is another token or none; a processor that cannot be run here counts
    as not expanding it."""
    from PIL import Image

    tokenizer = getattr(processor, "tokenizer", processor)
    try:
        expanded = processor(text=[placeholder], images=[Image.new("RGB", (224, 224))], return_tensors="pt")
        plain = tokenizer(placeholder)["input_ids"]
        return int((expanded["input_ids"] == token_id).sum()) > list(plain).count(token_id)
    except Exception as error:  # noqa: BLE001 - any failure means the placeholder was not seen to work
        logger.debug("could not run the processor to see what %r expands to: %s", placeholder, error)
        return False


def _check_template(template: str, folder: Path | str) -> None:
    try:
        import jinja2
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError:
        return
    try:
        ImmutableSandboxedEnvironment(extensions=["jinja2.ext.loopcontrols"]).parse(template)
    except jinja2.TemplateSyntaxError as error:
        raise ModelFolderError(f"{folder}: the chat template (chat_template.jinja or tokenizer_config.json) line "
                               f"{error.lineno}: {error.message}: fix the template or copy the model's own") from None


def load_processor_for(name_or_path: str, trust_remote_code: bool = False, adapter: Any = None):
    """HF's AutoProcessor, or, where it cannot be built (its video processor needs torchvision), the
    family's own (`adapter.load_processor`, e.g. LLaVA-OneVision's image-only processor), else a
    `SimpleVLProcessor` from the folder's tokenizer and image processor."""
    where = f"loading the tokenizer and processor of {name_or_path}"
    fix = "copy the original model's tokenizer and processor files into the folder"
    try:
        processor = transformers.AutoProcessor.from_pretrained(name_or_path, trust_remote_code=trust_remote_code)
        if hasattr(processor, "tokenizer") and hasattr(processor, "image_processor"):
            return processor
    except (ImportError, AttributeError, ValueError, TypeError, OSError) as error:
        logger.debug("AutoProcessor unavailable for %s (%s); using a fallback processor", name_or_path,
                     " ".join(str(error).split())[:300])
    with failure_context(where, fix):
        own = adapter.load_processor(name_or_path, trust_remote_code=trust_remote_code) if adapter is not None \
            else None
        if own is not None:
            return own
        tokenizer = transformers.AutoTokenizer.from_pretrained(name_or_path, trust_remote_code=trust_remote_code)
        image_processor = transformers.AutoImageProcessor.from_pretrained(name_or_path,
                                                                          trust_remote_code=trust_remote_code)
    chat_template = None
    template_file = os.path.join(name_or_path, "chat_template.jinja")
    if os.path.exists(template_file):
        with open(template_file, encoding="utf-8") as fh:
            chat_template = fh.read()
    image_token = getattr(adapter, "simple_processor_image_token", None) or "<|image_pad|>"
    return SimpleVLProcessor(tokenizer, image_processor, chat_template=chat_template, image_token=image_token)


__all__ = ["MissingWeightsError", "ModelFolder", "ModelFolderError", "check_processor", "compare_with_config",
           "load_processor_for", "read_config", "validate_model_folder"]

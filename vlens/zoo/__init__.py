"""Where models come from: the embedded default model, `random-tiny`, and `--model` specs.

- `vlens.zoo.embedded`: the embedded model (a tiny Qwen2.5-VL trained by vlens's own recipe):
  `load()`, `model_path()`, `load_hf()`, `is_embedded()`; its weights live in `weights/`.
- `vlens.zoo.specs`: the names `--model` and `vlens.load_model` accept (`tiny`, `random-tiny`, a
  folder, a hub id) and how they are loaded.
- `vlens.zoo.random_tiny`: the `random-tiny` plumbing model.

Names are imported lazily, so that the command line can read `vlens.zoo.specs` while it parses
arguments without loading torch and transformers.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_LAZY = {name: "vlens.zoo.embedded" for name in
         ("MODEL_NAME", "WEIGHTS_FOLDER", "is_embedded", "load", "load_hf", "model_path")}

if TYPE_CHECKING:
    from vlens.zoo.embedded import MODEL_NAME, WEIGHTS_FOLDER, is_embedded, load, load_hf, model_path


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'vlens.zoo' has no attribute {name!r}")


__all__ = ["MODEL_NAME", "WEIGHTS_FOLDER", "is_embedded", "load", "load_hf", "model_path"]

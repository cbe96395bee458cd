"""Where models come from: the embedded default model, `random-tiny`, and `--model` specs.

- `vlens.zoo.embedded`: the embedded model (a tiny Qwen2.5-VL trained by vlens's own recipe):
  `load()`, `model_path()`, `load_hf()`, `is_embedded()`; its weights live in `weights/`.
- `vlens.zoo.specs`: the names `--model` and `vlens.load_model` accept (`tiny`, `random-tiny`, a
  folder, a hub id) and how they are loaded.
- `vlens.zoo.random_tiny`: the `random-tiny` plumbing model.
- `vlens.zoo.image_sizes`: the square image size a model pins (`embedded_image_size()`, `render_size`),
  the size vlens renders images at by default.

Names are imported lazily, so that the command line can read `vlens.zoo.specs` while it parses
arguments without loading torch and transformers.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_LAZY = {name: "vlens.zoo.embedded" for name in
         ("MODEL_NAME", "WEIGHTS_FOLDER", "is_embedded", "load", "load_hf", "model_path")}
_LAZY.update({name: "vlens.zoo.image_sizes" for name in ("embedded_image_size", "render_size")})

if TYPE_CHECKING:
    from vlens.zoo.embedded import MODEL_NAME, WEIGHTS_FOLDER, is_embedded, load, load_hf, model_path
    from vlens.zoo.image_sizes import embedded_image_size, render_size


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'vlens.zoo' has no attribute {name!r}")


__all__ = ["MODEL_NAME", "WEIGHTS_FOLDER", "embedded_image_size", "is_embedded", "load", "load_hf", "model_path",
           "render_size"]

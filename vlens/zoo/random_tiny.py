"""`random-tiny`: a randomly initialised tiny Qwen2.5-VL, built offline, for plumbing.

`random_tiny_model()` is what `--model random-tiny` (and `vlens.load_model("random-tiny")`) loads:
the test suite's tiny Qwen2.5-VL (`vlens.testing.qwen`): 2 decoder layers of width 64 with 4 heads
(2 key/value heads), a 2-block vision tower, a 48-token word-level tokenizer with Qwen's special
tokens and chat format, and Qwen's PIL image processor (56*56 to 28*28*64 pixels). Its weights are
random (seed 0) with perturbed norms and biases, so every path through the model is exercised; its
answers mean nothing. Nothing is downloaded.
"""

from __future__ import annotations

from vlens.core.model import HookedVLM
from vlens.testing.qwen import tiny_hf_model, tiny_qwen_processor


def random_tiny_model(seed: int = 0, family: str = "qwen2_5_vl") -> HookedVLM:
    """The `random-tiny` model: `tiny_hf_model(family, seed)` with `tiny_qwen_processor()`, as a HookedVLM."""
    return HookedVLM.from_hf(tiny_hf_model(family, seed=seed), processor=tiny_qwen_processor())

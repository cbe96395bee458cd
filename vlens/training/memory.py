"""What lets a 7B model fine-tune on one GPU: activation (gradient) checkpointing of the decoder
blocks, and the loss computed from logits at the answer positions only.

Checkpointing keeps only each block's input during the forward and recomputes the block in the
backward (PyTorch's non-reentrant checkpoint, so hooks inside blocks, e.g. L_focus's pattern
capture, keep working and gradients are the same). Answer-only logits unembed just the
positions that predict answer tokens: never the [batch, seq, d_vocab] tensor (152k x 1,000+
tokens per row on Qwen2.5-VL).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import torch
from jaxtyping import Float, Int
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from vlens.training.data import IGNORE_INDEX
from vlens.utils.errors import UserInputError

if TYPE_CHECKING:
    from vlens.core.model import HookedVLM


# "auto" checkpoints models at least this wide: every 7-8B decoder (3584 / 4096), not the tiny ones
AUTO_CHECKPOINT_MIN_D_MODEL = 1024


def use_checkpointing(setting: str | bool, model: HookedVLM) -> bool:
    """Resolve the ``gradient_checkpointing`` setting ("auto", True, False) for ``model``."""
    if setting == "auto":
        return int(model.cfg.d_model) >= AUTO_CHECKPOINT_MIN_D_MODEL
    if not isinstance(setting, bool):
        raise UserInputError(f"gradient_checkpointing must be 'auto', True or False, got {setting!r}")
    return setting


@contextmanager
def gradient_checkpointing(model: HookedVLM, enabled: bool = True) -> Iterator[None]:
    """Checkpoint every decoder block of ``model`` while training inside the block.

    Only forwards that need gradients are checkpointed (``torch.is_grad_enabled()`` and no KV
    cache); the original forwards come back on exit, also on error.
    """
    if not enabled:
        yield
        return
    originals = []
    for block in model.blocks:
        original = block.forward

        def checkpointed(resid, cos, sin, masks, kv_cache=None, deepstack=None, _original=original):
            if kv_cache is not None or not torch.is_grad_enabled():
                return _original(resid, cos, sin, masks, kv_cache, deepstack=deepstack)
            return checkpoint(_original, resid, cos, sin, masks, None, deepstack=deepstack, use_reentrant=False)

        block.forward = checkpointed  # type: ignore[method-assign]
        originals.append(block)
    try:
        yield
    finally:
        for block in originals:
            del block.forward  # the instance attribute; the class's forward shows again


def answer_positions(labels: Int[Tensor, "batch seq"]) -> Int[Tensor, "n 2"]:
    """(row, position) of every position whose next token is an answer token (labels[:, 1:] set)."""
    return (labels[:, 1:] != IGNORE_INDEX).nonzero()


def answer_only_loss(
    model: HookedVLM, resid: Float[Tensor, "batch seq d_model"], labels: Int[Tensor, "batch seq"]
) -> Float[Tensor, ""]:
    """Mean cross-entropy over answer tokens from the final residual stream (the last block's
    output, before the final norm: ``model(inputs, stop_at_layer=model.cfg.n_layers)``).

    Only the positions that predict answer tokens are normalised and unembedded (by
    ``model.finish``, the model's own read-out): fp32 logits [n_answer_tokens, d_vocab].
    """
    where = answer_positions(labels)
    if where.shape[0] == 0:
        raise UserInputError("the batch has no answer tokens to train on: give every example a non-empty answer")
    rows, positions = where[:, 0], where[:, 1]
    logits = model.finish(resid[rows.to(resid.device), positions.to(resid.device)], "logits")  # [n, d_vocab]
    targets = labels[rows, positions + 1]
    return torch.nn.functional.cross_entropy(logits.float(), targets.to(logits.device))

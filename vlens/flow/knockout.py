"""Attention knockout: block attention from query positions to key positions at chosen layers / heads.

    with knockout(model, src="image", dst="final", layers=range(8, 12), inputs=inputs):
        logits = model(inputs)

Inside the context, at each chosen layer (and head), the attention score of every query position
in `dst` to every key position in `src` is set to -inf before the softmax, so the softmax
renormalises over the keys that remain (Geva et al. 2023; Zhang et al., CVPR 2025):

    pattern[b, h, q, k] = exp(s[b, h, q, k]) * keep[b, h, q, k] / sum_k' exp(s[b, h, q, k']) * keep[b, h, q, k']
    keep[b, h, q, k] = not (dst[b, q] and src[b, k] and h in heads)

It is an edit of the attention mask (`Attention.mask_edits`), applied after the causal / padding
mask, the sliding window and Gemma 3's bidirectional image blocks: on the fast path SDPA reads the
edited bool mask (no pattern is computed), on the explicit path the edited mask is what the scores
are masked with, so the result equals editing `hook_attn_scores` by hand. Per-head knockout is a
[batch, n_heads, q, k] mask (each query head: grouped-query layers share keys, not masks).
Linear-attention layers (Qwen3.5's Gated DeltaNet) have no attention scores to edit: naming one
is an error; `layers=None` means every softmax-attention layer. The edit belongs to the thread that
made it and is removed when the context ends, also on error.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import torch
from jaxtyping import Bool
from torch import Tensor

from vlens.core.components.attention import Attention, AttentionMasks
from vlens.core.hooks import thread_token
from vlens.core.inputs import VLMInputs
from vlens.flow.positions import PositionSpec, position_mask
from vlens.utils.errors import UserInputError

if TYPE_CHECKING:
    from vlens.core.model import HookedVLM


def softmax_layers(model: HookedVLM) -> list[int]:
    """The decoder layers whose token mixer is softmax attention (every layer but linear-attention ones)."""
    return [block.layer for block in model.blocks if isinstance(block.attn, Attention)]


def check_layers(model: HookedVLM, layers: Iterable[int] | None) -> list[int]:
    """`layers` as a sorted list, checked: in range and softmax attention (None: every such layer)."""
    available = softmax_layers(model)
    if layers is None:
        return available
    chosen = sorted({int(layer) for layer in layers})
    if not chosen:
        raise UserInputError("knockout: no layers given; pass layers=None for every attention layer")
    n_layers = model.cfg.n_layers
    outside = [layer for layer in chosen if not 0 <= layer < n_layers]
    if outside:
        raise UserInputError(f"knockout: layers {outside} do not exist (the model has {n_layers}: 0-{n_layers - 1})")
    linear = [layer for layer in chosen if layer not in available]
    if linear:
        raise UserInputError(
            f"knockout: layers {linear} are linear attention (Gated DeltaNet), which has no attention scores to "
            f"block; knock out at the softmax-attention layers {available} (layers=None picks them all)")
    return chosen


def check_heads(model: HookedVLM, heads: Iterable[int] | None) -> list[int] | None:
    if heads is None:
        return None
    chosen = sorted({int(h) for h in heads})
    outside = [h for h in chosen if not 0 <= h < model.cfg.n_heads]
    if not chosen or outside:
        raise UserInputError(f"knockout: heads must be a non-empty set of query heads in 0-{model.cfg.n_heads - 1}, "
                             f"got {list(heads) if not outside else outside}")
    return chosen


def _as_mask(spec: Any, inputs: VLMInputs | None, what: str) -> Tensor:
    if inputs is not None:
        if isinstance(spec, Tensor) and inputs.regions is not None and spec is inputs.regions.final:
            spec = "final"  # `inputs.regions.final` itself: each row's own final position
        return position_mask(spec, inputs, what)
    if isinstance(spec, Tensor) and spec.dtype == torch.bool and spec.ndim == 2:
        return spec.cpu()
    raise UserInputError(f"knockout: {what} needs inputs=... to be resolved (a region name, positions or "
                         "per-row lists are read against the inputs), or give it as a bool mask [batch, pos]")


class KnockoutEdit:
    """The mask edit one `knockout` context adds to its layers (see the module docstring).

    src, dst: bool [batch, pos] key / query positions (absolute, from the start of the sequence);
    heads: query heads, or None for all. Called with a layer's masks and the absolute position of its
    first key, returns the masks with the blocked entries removed.
    """

    def __init__(self, src: Tensor, dst: Tensor, heads: list[int] | None, n_heads: int):
        if src.shape != dst.shape:
            raise UserInputError(f"knockout: src and dst cover different batches / lengths: {tuple(src.shape)} vs "
                                 f"{tuple(dst.shape)}")
        self.src, self.dst, self.heads, self.n_heads = src, dst, heads, n_heads
        self._last: tuple[int, int, AttentionMasks, AttentionMasks] | None = None  # the last edit (layers share it)

    def _fit(self, mask: Tensor, length: int, device: torch.device) -> Tensor:
        if mask.shape[1] < length:  # decoding past the prompt: new positions are in no set
            mask = torch.nn.functional.pad(mask, (0, length - mask.shape[1]), value=False)
        return mask[:, :length].to(device)

    def blocked(self, masks: AttentionMasks, kv_offset: int) -> Bool[Tensor, "batch heads q k"]:
        """Entries this edit blocks in a layer's mask: [batch, 1 or n_heads, q, k]."""
        batch, _, q_len, k_len = masks.allowed.shape
        if batch != self.src.shape[0]:
            raise UserInputError(f"knockout: the positions were given for a batch of {self.src.shape[0]} but the "
                                 f"model runs a batch of {batch}; build them from the inputs you run")
        total, device = kv_offset + k_len, masks.allowed.device
        dst = self._fit(self.dst, total, device)[:, total - q_len:]  # [batch, q]
        src = self._fit(self.src, total, device)[:, kv_offset:]  # [batch, k]
        block = (dst[:, :, None] & src[:, None, :])[:, None]  # [batch, 1, q, k]
        if self.heads is not None:
            chosen = torch.zeros(self.n_heads, dtype=torch.bool, device=device)
            chosen[self.heads] = True
            block = block & chosen[None, :, None, None]
        return block

    def __call__(self, masks: AttentionMasks, kv_offset: int) -> AttentionMasks:
        last = self._last
        if last is not None and last[0] == id(masks) and last[1] == kv_offset and last[2] is masks:
            return last[3]
        allowed = masks.allowed & ~self.blocked(masks, kv_offset)
        emptied = masks.allowed.any(dim=-1) & ~allowed.any(dim=-1)  # [batch, heads, q]
        if bool(emptied.any()):
            row, head, query = (int(i) for i in emptied.nonzero()[0])
            total = kv_offset + masks.allowed.shape[-1]
            position = total - masks.allowed.shape[-2] + query
            where = "" if allowed.shape[1] == 1 else f", head {head}"
            raise UserInputError(
                f"knockout: row {row}'s query at position {position}{where} would have no key left to attend to "
                "(every key it may read is in src); leave it out of dst or keep some of its keys out of src")
        edited = masks.restricted(allowed)
        self._last = (id(masks), kv_offset, masks, edited)
        return edited


@contextmanager
def knockout(
    model: HookedVLM,
    src: PositionSpec,
    dst: PositionSpec,
    layers: Iterable[int] | None = None,
    heads: Iterable[int] | None = None,
    inputs: VLMInputs | None = None,
) -> Iterator[KnockoutEdit]:
    """Block attention from the query positions `dst` to the key positions `src` while the context is open.

    Args:
        model: a HookedVLM.
        src: key positions (what is no longer read): a region name ("image", "text", "question", "final",
            "all", "prompt"), positions, a bool mask [batch, pos] or one position list / token selection per
            row (`vlens.flow.positions`). `inputs.regions.final` itself means each row's final position.
        dst: query positions (who no longer reads them), in the same forms.
        layers: decoder layers to knock out at (None: every softmax-attention layer).
        heads: query heads to knock out (None: all heads).
        inputs: the `VLMInputs` the positions refer to (needed unless src and dst are bool [batch, pos]).

    Yields the `KnockoutEdit` (its `src` / `dst` masks [batch, pos]). Runs inside the context with that
    batch are knocked out; a batch of another size is an error. A query left with no key raises
    `UserInputError` during the forward. The edit is removed when the context ends, also on error.
    """
    chosen_layers = check_layers(model, layers)
    chosen_heads = check_heads(model, heads)
    src_mask, dst_mask = _as_mask(src, inputs, "src"), _as_mask(dst, inputs, "dst")
    edit = KnockoutEdit(src_mask, dst_mask, chosen_heads, model.cfg.n_heads)
    entry = (thread_token(), edit)  # a thread id could be reused by a later thread
    added: list[list] = []
    try:
        for layer in chosen_layers:
            attn = model.blocks[layer].attn
            if not isinstance(attn, Attention):  # check_layers keeps softmax layers only
                raise RuntimeError(f"layer {layer} has no softmax attention")
            edits = attn.mask_edits
            edits.append(entry)
            added.append(edits)
        yield edit
    finally:
        for edits in added:
            edits[:] = [e for e in edits if e is not entry]


def knockout_logits(
    model: HookedVLM,
    inputs: VLMInputs,
    src: PositionSpec,
    dst: PositionSpec,
    layers: Sequence[int] | None = None,
    heads: Sequence[int] | None = None,
) -> Tensor:
    """Logits [batch, pos, d_vocab] of one forward with the knockout applied (`knockout`)."""
    with torch.no_grad(), knockout(model, src, dst, layers=layers, heads=heads, inputs=inputs):
        return model(inputs)

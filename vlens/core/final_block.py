"""Run the last decoder block for the readout positions only (the fast sweeps' last step: patching,
ablation).

The logits at the readout positions (the final one by default) need the last block's output
there alone: its attention still reads keys / values at every position, but the queries, the
output projection and the MLP are only needed at those positions. Numerically this is the
block's own computation restricted to those queries (SDPA over the same keys), equal within
float noise.
Used only when no hook is attached to the last block (its hooks would see a different shape) and the
block is the plain pre-norm one (`supports_last_block_at`).
"""

from __future__ import annotations

from typing import Any

import torch
from jaxtyping import Float, Int
from torch import Tensor
from transformers.integrations.sdpa_attention import repeat_kv

from vlens.core.components.attention import Attention
from vlens.core.components.block import TransformerBlock
from vlens.core.components.rotary import apply_rotary
from vlens.core.runtime import RunState, module_device
from vlens.utils.errors import UserInputError


def gather_positions(x: Float[Tensor, "batch pos ..."], positions: Int[Tensor, "batch k"]) -> Float[Tensor, "batch k ..."]:
    """x at each row's positions: x[b, positions[b, j]]."""
    index = positions.to(x.device).view(*positions.shape, *([1] * (x.ndim - 2))).expand(-1, -1, *x.shape[2:])
    return x.gather(1, index)


def supports_last_block_at(block) -> bool:
    """True when `last_block_at` can run the block: the plain pre-norm block with plain softmax attention
    (no output gate, no linear attention, one rotary table in every layer, no sliding window, no post-sublayer
    norms, no parallel attention + MLP);
    other blocks run whole."""
    attn = block.attn
    return (type(block) is TransformerBlock and type(attn) is Attention and attn.sliding_window is None
            and attn.rotary_index is None and attn.uses_rope and attn.attention_chunk is None)


def block_has_hooks(block) -> bool:
    """True if any hook point inside `block` has a forward or backward hook."""
    return any(getattr(m, "fwd_hooks", None) or getattr(m, "bwd_hooks", None) for m in block.modules())


def last_block_at(model: Any, resid: Float[Tensor, "batch pos d_model"], state: RunState,
                  positions: Int[Tensor, "batch k"]) -> Float[Tensor, "batch k d_model"]:
    """The last block's output residual at each row's `positions` (e.g. its final position).

    `resid` may be a suffix of the sequence (then `state.kv_cache` holds the prefix's keys / values
    and `positions` count from the suffix's start).
    """
    block = model.blocks[-1]
    device = module_device(block)  # where a device map placed it
    resid, state = resid.to(device), state.on(device)
    attn = block.attn
    if not isinstance(attn, Attention) or not supports_last_block_at(block):
        raise UserInputError(f"last_block_at runs plain softmax attention only, not {type(attn).__name__}")
    batch, pos, _ = resid.shape
    n_read = positions.shape[1]
    rows = torch.arange(batch, device=resid.device)[:, None]
    positions = positions.to(resid.device)
    d_head = attn.cfg.d_head
    x = block.ln1(resid)
    x_read = gather_positions(x, positions)  # [b, k, d]
    q = attn.q_proj(x_read).view(batch, n_read, -1, d_head)
    k = attn.k_proj(x).view(batch, pos, -1, d_head)
    v = attn.v_proj(x).view(batch, pos, -1, d_head)
    if attn.q_norm is not None and attn.k_norm is not None:
        q, k = attn.q_norm(q), attn.k_norm(k)
    adjacent = attn.cfg.rope_adjacent_pairs
    q = apply_rotary(q, gather_positions(state.cos, positions), gather_positions(state.sin, positions), adjacent)
    k = apply_rotary(k, state.cos, state.sin, adjacent)
    cache = state.kv_cache
    prefix_k = None if cache is None else cache.keys[block.layer]
    prefix_v = None if cache is None else cache.values[block.layer]
    if prefix_k is not None and prefix_v is not None:  # a suffix run: prepend the prefix
        k = torch.cat([prefix_k, k], dim=1)
        v = torch.cat([prefix_v, v], dim=1)
    allowed = state.masks.allowed[rows, :, positions].transpose(1, 2)  # [b, 1, k, kv_len]
    groups = attn.num_key_value_groups
    z = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2), repeat_kv(k.transpose(1, 2), groups), repeat_kv(v.transpose(1, 2), groups),
        attn_mask=allowed, scale=attn.scaling,
    ).transpose(1, 2)  # [b, k, H, d_head]
    attn_out = attn.o_proj(z.reshape(batch, n_read, -1)) if not attn.cfg.use_attn_result else \
        torch.einsum("bphd,hdm->bpm", z, attn.W_O) + attn.b_O
    mid = gather_positions(resid, positions) + attn_out
    return mid + block.mlp(block.ln2(mid))

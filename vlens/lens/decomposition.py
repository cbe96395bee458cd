"""Per-head decomposition of the attention output.

Multi-head attention is additive over heads. With ``z[..., i, :]`` head i's output
(``hook_z``), head i's contribution to the residual stream is ``z_i @ W_O[i]``; this equals
the paper's zero-padded form ``h~_i @ W_O_flat`` (``h~_i`` is ``z`` with every other head
zeroed, ``W_O_flat`` the ``[n_heads * d_head, d_model]`` output projection) and

    sum_i z_i @ W_O[i] + b_O == hook_attn_out        (exactly, up to float rounding)

This is TransformerLens's per-head ``hook_result`` without materialising it in the forward.

Blocks with a norm after the attention (Gemma 3's ``ln1_post``) add ``ln1_post(sum_i z_i @ W_O[i] +
b_O)`` to the residual, and that is their ``hook_attn_out``. At the run's scale ``s`` (the norm's
``hook_scale``) the norm is linear, so head i's share is ``w * (z_i @ W_O[i]) / s`` with ``w`` the
norm's effective weight, and the shares plus ``w * b_O / s`` sum to ``hook_attn_out`` (TransformerLens's
``apply_ln_to_stack`` convention): `layer_head_contributions` and `layer_bias_contribution` do this.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import einops
import torch
from jaxtyping import Float
from torch import Tensor

from vlens.core.components.sandwich_block import post_norm_shares
from vlens.utils.errors import UserInputError

if TYPE_CHECKING:
    from vlens.core.model import HookedVLM



def head_contributions(
    z: Float[Tensor, "... n_heads d_head"],
    W_O: Float[Tensor, "n_heads d_head d_model"],
) -> Float[Tensor, "... n_heads d_model"]:
    """Each head's write into the residual stream: ``z_i @ W_O[i]`` for every head i."""
    if z.shape[-2:] != W_O.shape[:2]:
        raise UserInputError(
            f"z ends in {tuple(z.shape[-2:])} (n_heads, d_head) but W_O is {tuple(W_O.shape)} "
            "(n_heads, d_head, d_model): pass one layer's hook_z and that layer's W_O (model.blocks[l].attn.W_O)."
        )
    return torch.einsum("...hd,hdm->...hm", z, W_O.to(z.dtype))


def zero_padded_head_output(z: Float[Tensor, "... n_heads d_head"], head: int) -> Float[Tensor, "... hd"]:
    """The paper's ``h~_i``: z flattened to ``n_heads * d_head`` with every head but ``head`` zeroed."""
    n_heads = z.shape[-2]
    if not 0 <= head < n_heads:
        raise IndexError(f"head {head} outside 0..{n_heads - 1}")
    keep = torch.zeros(n_heads, 1, dtype=z.dtype, device=z.device)
    keep[head] = 1
    return einops.rearrange(z * keep, "... h d -> ... (h d)")


def flat_W_O(W_O: Float[Tensor, "n_heads d_head d_model"]) -> Float[Tensor, "hd d_model"]:
    """``W_O`` as the single ``[n_heads * d_head, d_model]`` matrix the paper pads into."""
    return einops.rearrange(W_O, "h d m -> (h d) m")


def attention_post_norm(model: HookedVLM, layer: int):
    """The norm block `layer` applies to its attention output before the residual (``ln1_post``), or None."""
    return getattr(model.blocks[layer], "ln1_post", None)


def _post_norm_scale(model: HookedVLM, cache, layer: int):
    norm = attention_post_norm(model, layer)
    if norm is None:
        return None, None
    name = f"blocks.{layer}.ln1_post.hook_scale"
    if name not in cache:
        raise KeyError(f"{name} is not in the cache: block {layer} normalizes its attention output, so its heads' "
                       "shares need that scale; include it in run_with_cache(..., names_filter=...).")
    return norm, cache[name]


def layer_head_contributions(model: HookedVLM, cache, layer: int) -> Float[Tensor, "batch pos n_heads d_model"]:
    """Head contributions of one layer to ``hook_attn_out`` from a cache holding ``blocks.{layer}.attn.hook_z``
    (and ``blocks.{layer}.ln1_post.hook_scale`` where the block normalizes its attention output)."""
    name = f"blocks.{layer}.attn.hook_z"
    if name not in cache:
        raise KeyError(f"{name} is not in the cache: run model.run_with_cache(..., names_filter=...) including it.")
    contributions = head_contributions(cache[name], model.blocks[layer].attn.W_O)
    norm, scale = _post_norm_scale(model, cache, layer)
    return contributions if norm is None else post_norm_shares(contributions, norm, scale)


def layer_bias_contribution(model: HookedVLM, cache, layer: int) -> Float[Tensor, "... d_model"]:
    """What ``hook_attn_out`` holds besides the heads: ``b_O``, or ``w * b_O / scale`` through a post norm."""
    b_O = model.blocks[layer].attn.b_O
    norm, scale = _post_norm_scale(model, cache, layer)
    if norm is None:
        return b_O
    return post_norm_shares(b_O.expand(*scale.shape[:-1], 1, -1).to(scale.dtype), norm, scale)[..., 0, :]


def reconstruct_attn_out(
    contributions: Float[Tensor, "... n_heads d_model"], b_O: Float[Tensor, "d_model"]
) -> Float[Tensor, "... d_model"]:
    """``sum_i contribution_i + b_O``: what ``hook_attn_out`` holds."""
    return contributions.sum(dim=-2) + b_O.to(contributions.dtype)

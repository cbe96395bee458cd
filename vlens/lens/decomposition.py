"""Per-head decomposition of the attention output.

Multi-head attention is additive over heads. With ``z[..., i, :]`` head i's output
(``hook_z``), head i's contribution to the residual stream is ``z_i @ W_O[i]``; this equals
the paper's zero-padded form ``h~_i @ W_O_flat`` (``h~_i`` is ``z`` with every other head
zeroed, ``W_O_flat`` the ``[n_heads * d_head, d_model]`` output projection) and

    sum_i z_i @ W_O[i] + b_O == hook_attn_out        (exactly, up to float rounding)

This is TransformerLens's per-head ``hook_result`` without materialising it in the forward.
"""

from __future__ import annotations

import einops
import torch
from jaxtyping import Float
from torch import Tensor


def head_contributions(
    z: Float[Tensor, "... n_heads d_head"],
    W_O: Float[Tensor, "n_heads d_head d_model"],
) -> Float[Tensor, "... n_heads d_model"]:
    """Each head's write into the residual stream: ``z_i @ W_O[i]`` for every head i."""
    if z.shape[-2:] != W_O.shape[:2]:
        raise ValueError(
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


def layer_head_contributions(model, cache, layer: int) -> Float[Tensor, "batch pos n_heads d_model"]:
    """Head contributions of one layer from a cache holding ``blocks.{layer}.attn.hook_z``."""
    name = f"blocks.{layer}.attn.hook_z"
    if name not in cache:
        raise KeyError(f"{name} is not in the cache: run model.run_with_cache(..., names_filter=...) including it.")
    return head_contributions(cache[name], model.blocks[layer].attn.W_O)


def reconstruct_attn_out(
    contributions: Float[Tensor, "... n_heads d_model"], b_O: Float[Tensor, "d_model"]
) -> Float[Tensor, "... d_model"]:
    """``sum_i contribution_i + b_O``: what ``hook_attn_out`` holds."""
    return contributions.sum(dim=-2) + b_O.to(contributions.dtype)

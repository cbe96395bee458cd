"""A decoder block with a norm before and after each sublayer (Gemma 2 / 3's "sandwich" norms).

    resid -> ln1 -> attn -> ln1_post -> (+ resid) -> ln2 -> mlp -> ln2_post -> (+ resid)

HF's names: ln1 = input_layernorm, ln1_post = post_attention_layernorm, ln2 =
pre_feedforward_layernorm, ln2_post = post_feedforward_layernorm (TransformerLens's names for
Gemma 2). `hook_attn_out` / `hook_mlp_out` are the post-norm outputs, what the sublayer adds to the
residual stream (as in TransformerLens), so ``resid_mid = resid_pre + attn_out`` still holds; the
attention's own output (the sum of its heads, ``sum_h z_h @ W_O[h] + b_O``) is ln1_post's input,
``ln1_post.hook_normalized * ln1_post.hook_scale``. A head's share of `hook_attn_out` at the run's
scale is ``(1 + ln1_post.w) * (z_h @ W_O[h]) / ln1_post.hook_scale`` (`post_norm_shares`).
"""

from __future__ import annotations

from jaxtyping import Float
from torch import Tensor

from vlens.core.components.attention import Attention, AttentionMasks, KVCache
from vlens.core.components.block import TransformerBlock
from vlens.core.components.gated_deltanet import GatedDeltaNet
from vlens.core.components.mlp import GatedMLP
from vlens.core.components.moe import MoEMLP
from vlens.core.components.rms_norm import RMSNormPre
from vlens.core.components.short_conv import ShortConv


class SandwichBlock(TransformerBlock):
    """`TransformerBlock` with post-sublayer norms; the same hook points plus ln1_post.* and ln2_post.*."""

    def __init__(self, layer: int, ln1: RMSNormPre, attn: Attention | GatedDeltaNet | ShortConv, ln1_post: RMSNormPre,
                 ln2: RMSNormPre, mlp: GatedMLP | MoEMLP, ln2_post: RMSNormPre):
        super().__init__(layer, ln1, attn, ln2, mlp)
        self.ln1_post, self.ln2_post = ln1_post, ln2_post

    def forward(
        self,
        resid: Float[Tensor, "batch pos d_model"],
        cos: Tensor,
        sin: Tensor,
        masks: AttentionMasks,
        kv_cache: KVCache | None = None,
        deepstack: tuple[Tensor, Tensor] | None = None,
    ) -> Float[Tensor, "batch pos d_model"]:
        if deepstack is not None:
            raise RuntimeError(f"block {self.layer} takes no DeepStack features (a family with post-sublayer norms)")
        resid = self.hook_resid_pre(resid)
        attn_out = self.hook_attn_out(self.ln1_post(self.attn(self.ln1(resid), cos, sin, masks, kv_cache)))
        resid = self.hook_resid_mid(resid + attn_out)
        mlp_out = self.hook_mlp_out(self.ln2_post(self.mlp(self.ln2(resid))))
        return self.hook_resid_post(resid + mlp_out)


def post_norm_shares(
    parts: Float[Tensor, "... n d_model"],
    norm: RMSNormPre,
    scale: Float[Tensor, "... 1"],
) -> Float[Tensor, "... n d_model"]:
    """Each part's share of a post-sublayer RMSNorm's output at the run's scale: ``w * part / scale``.

    An RMSNorm with its scale held fixed is linear, so shares of parts that sum to its input sum to its
    output (TransformerLens's ``apply_ln_to_stack`` convention). parts: e.g. the heads' ``z_h @ W_O[h]``,
    [..., n_parts, d_model]; norm: the block's ``ln1_post`` / ``ln2_post`` (its ``effective_weight``, 1 + w,
    for a zero-centred norm, else ``w``); scale: that norm's ``hook_scale`` at the same positions, [..., 1].
    """
    # what the norm multiplies by: 1 + w for a zero-centred norm (Gemma's), w for a plain one
    weight = getattr(norm, "effective_weight", None)
    weight = (norm.w if weight is None else weight).to(parts.device)
    return parts * (weight / scale.to(parts.device).unsqueeze(-2)).to(parts.dtype)

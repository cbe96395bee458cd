"""One pre-norm decoder block: resid -> ln1 -> attn -> + -> ln2 -> mlp -> +."""

from __future__ import annotations

from collections.abc import Iterator
from typing import cast, overload

from jaxtyping import Float
from torch import Tensor, nn

from vlens.core.components.attention import Attention, AttentionMasks, KVCache
from vlens.core.components.gated_deltanet import GatedDeltaNet
from vlens.core.components.mlp import GatedMLP
from vlens.core.components.moe import MoEMLP
from vlens.core.components.rms_norm import RMSNormPre
from vlens.core.components.short_conv import ShortConv
from vlens.core.hooks import HookPoint


class TransformerBlock(nn.Module):
    # read by TransformerLens's logit lens: hook_resid_post is the one residual stream
    hook_out_is_single_residual_stream = True
    # True where attention and MLP read one norm of hook_resid_pre (`ParallelBlock`, Cohere)
    parallel = False
    # the residual hook the MLP's input is a norm of (`mlp_input`): resid_mid here, resid_pre in a parallel block
    mlp_input_hook = "hook_resid_mid"

    def __init__(self, layer: int, ln1: RMSNormPre, attn: Attention | GatedDeltaNet | ShortConv, ln2: RMSNormPre,
                 mlp: GatedMLP | MoEMLP):
        """attn: softmax attention (`Attention`, `GatedAttention`) or linear attention (`GatedDeltaNet`);
        mlp: a dense `GatedMLP` or a mixture of experts (`MoEMLP`); ln1 / ln2: `RMSNorm` or `ZeroCenteredRMSNorm`."""
        super().__init__()
        self.layer = layer
        self.ln1, self.attn, self.ln2, self.mlp = ln1, attn, ln2, mlp
        self.hook_resid_pre = HookPoint()  # [batch, pos, d_model]
        self.hook_attn_out = HookPoint()  # [batch, pos, d_model]
        self.hook_resid_mid = HookPoint()  # [batch, pos, d_model]
        self.hook_mlp_out = HookPoint()  # [batch, pos, d_model]
        self.hook_resid_post = HookPoint()  # [batch, pos, d_model]
        self.hook_deepstack = HookPoint()  # [n_image_tokens, d_model] (Qwen3-VL only)

    def forward(
        self,
        resid: Float[Tensor, "batch pos d_model"],
        cos: Tensor,
        sin: Tensor,
        masks: AttentionMasks,
        kv_cache: KVCache | None = None,
        deepstack: tuple[Tensor, Tensor] | None = None,
    ) -> Float[Tensor, "batch pos d_model"]:
        """`deepstack`: (image-position mask [batch, pos], features [n_image_tokens, d_model]) added
        to the residual at image positions after this block (Qwen3-VL), before `hook_resid_post`."""
        resid = self.hook_resid_pre(resid)
        attn_out = self.hook_attn_out(self.attn(self.ln1(resid), cos, sin, masks, kv_cache))
        resid = self.hook_resid_mid(resid + attn_out)
        mlp_out = self.hook_mlp_out(self.mlp(self.ln2(resid)))
        resid = resid + mlp_out
        if deepstack is not None:
            image_mask, features = deepstack
            features = self.hook_deepstack(features.to(resid.device, resid.dtype))
            resid = resid.clone()
            resid[image_mask] = resid[image_mask] + features
        return self.hook_resid_post(resid)


    def mlp_input(self, resid: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"]:
        """What the MLP reads, from the residual at `mlp_input_hook`: ln2(resid_mid) (with its weight)."""
        return self.ln2(resid)


class BlockList(nn.ModuleList):
    """The decoder blocks: an `nn.ModuleList` that type checkers know holds `TransformerBlock`s."""

    @overload
    def __getitem__(self, index: slice) -> BlockList: ...

    @overload
    def __getitem__(self, index: int) -> TransformerBlock: ...

    def __getitem__(self, index: int | slice) -> TransformerBlock | BlockList:
        return super().__getitem__(index)  # type: ignore[return-value]  # ModuleList types its items as Module

    def __iter__(self) -> Iterator[TransformerBlock]:
        return cast(Iterator[TransformerBlock], super().__iter__())

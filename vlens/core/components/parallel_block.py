"""A decoder block whose attention and MLP both read one norm of the residual (Cohere / Command R):

    resid_post = resid_pre + attn(ln1(resid_pre)) + mlp(ln1(resid_pre))

The hook points are `TransformerBlock`'s: ``hook_resid_mid = resid_pre + attn_out`` and ``hook_resid_post =
resid_mid + mlp_out`` (HF's order of the two additions), so the residual is still the sum of what each
sublayer writes. The MLP does NOT read `hook_resid_mid`: it reads ``ln1(resid_pre)``, the attention's input.
Transcoders and attribution graphs read the MLP's input through `mlp_input` at `mlp_input_hook` (here
``ln1(hook_resid_pre)``); the circuit graph (an MLP reading its own layer's heads) refuses such a block, and
`ln2` says why when called.
"""

from __future__ import annotations

from jaxtyping import Float
from torch import Tensor, nn

from vlens.core.components.attention import Attention, AttentionMasks, KVCache
from vlens.core.components.block import TransformerBlock
from vlens.core.components.mlp import GatedMLP
from vlens.core.components.moe import MoEMLP
from vlens.core.components.rms_norm import RMSNormPre
from vlens.utils.errors import UserInputError


class NoSecondNorm(nn.Module):
    """`ParallelBlock.ln2`: there is no norm between attention and MLP; calling it says so."""

    def forward(self, x: Tensor) -> Tensor:
        raise UserInputError(
            "this model's decoder blocks run attention and MLP in parallel from one norm (Cohere's layout: the MLP "
            "reads ln1(hook_resid_pre), not ln2(hook_resid_mid)): read the MLP input with block.mlp_input(resid) at "
            "block.mlp_input_hook (blocks.{l}.ln1.hook_normalized).")


class ParallelBlock(TransformerBlock):
    """`TransformerBlock` with attention and MLP in parallel; `ln1` feeds both, `ln2` is a `NoSecondNorm`."""

    parallel = True
    mlp_input_hook = "hook_resid_pre"

    def mlp_input(self, resid: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"]:
        """What the MLP reads: ln1(resid_pre), the attention's input too."""
        return self.ln1(resid)

    def __init__(self, layer: int, ln1: RMSNormPre, attn: Attention, mlp: GatedMLP | MoEMLP):
        super().__init__(layer, ln1, attn, ln1, mlp)
        self.ln2 = NoSecondNorm()  # type: ignore[assignment]  # a guard, not a norm

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
            raise RuntimeError(f"block {self.layer} takes no DeepStack features (a parallel attention + MLP block)")
        resid = self.hook_resid_pre(resid)
        x = self.ln1(resid)
        attn_out = self.hook_attn_out(self.attn(x, cos, sin, masks, kv_cache))
        mlp_out = self.hook_mlp_out(self.mlp(x))
        resid = self.hook_resid_mid(resid + attn_out)
        return self.hook_resid_post(resid + mlp_out)

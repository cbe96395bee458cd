"""LFM2's double-gated short convolution with hooks on its inputs and outputs, heads as channel groups.

One layer, following HF's `Lfm2ShortConv` step by step (and calling HF's own causal-conv functions,
so the numbers are HF's):

    x_in  (padding positions zeroed, as HF does)
    [b; c; x] = in_proj(x_in)                                        -> hook_b, hook_c, hook_x
    u = b * x                                                        -> hook_conv_in
    v = causal depthwise conv over positions (kernel L, per channel) -> hook_conv_out
    z = c * v                                                        -> hook_z
    out = out_proj(z)   (z flattened over heads: sum_h z_h @ W_O[h])

The convolution is depthwise (each channel reads only its own past L values), so any split of the
d_model channels into groups is an exact decomposition: channel group h of b, c and x reaches only
channel group h of z. vlens splits them into `cfg.linear_n_heads` groups of `cfg.linear_d_head`
channels (the attention layers' head count and size, so head grids stay uniform): a "head" of a conv
layer is one such group, hooked [batch, pos, n_heads, d_head] at every step, and `hook_z` is what
out_proj reads from it, as in softmax attention. There is no attention pattern.

Decoding keeps HF's conv state: the last L inputs u per layer (`KVCache.conv_states`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from jaxtyping import Float
from torch import Tensor, nn

from vlens.core.components.attention import AttentionMasks, KVCache
from vlens.core.components.gated_deltanet import PatternlessMixer, last_columns
from vlens.core.config import VLMConfig
from vlens.core.hooks import HookPoint


class ShortConv(PatternlessMixer):
    """LFM2's short-convolution token mixer with hooks (module docstring); HF's parameters in place.

    conv / conv_update: HF's `causal_conv1d_fn` (a whole sequence) and `causal_conv1d_update` (one
    decoding step, updating the state in place), taken from HF's module. Its forward takes a block's
    attention arguments (cos / sin are unused: no rotary here).
    """

    mixer = "short_conv"
    in_proj: nn.Linear
    conv: nn.Conv1d
    out_proj: nn.Linear

    def __init__(self, cfg: VLMConfig, layer: int, hf_conv: nn.Module, conv: Callable, conv_update: Callable):
        super().__init__()
        self.cfg, self.layer = cfg, layer
        self.n_heads, self.d_head = cfg.linear_n_heads, cfg.linear_d_head
        self.in_proj = hf_conv.in_proj  # type: ignore[assignment]  # HF's modules themselves
        self.conv = hf_conv.conv  # type: ignore[assignment]
        self.out_proj = hf_conv.out_proj  # type: ignore[assignment]
        self.kernel = int(self.conv.kernel_size[0])
        if self.n_heads * self.d_head != self.out_proj.in_features:
            raise RuntimeError(f"{self.n_heads} x {self.d_head} channel groups do not cover the conv's "
                               f"{self.out_proj.in_features} channels")
        self._conv, self._conv_update = conv, conv_update

        self.hook_b = HookPoint()  # [batch, pos, n_heads, d_head] the input gate
        self.hook_c = HookPoint()  # [batch, pos, n_heads, d_head] the output gate
        self.hook_x = HookPoint()  # [batch, pos, n_heads, d_head] the values
        self.hook_conv_in = HookPoint()  # [batch, pos, n_heads, d_head] b * x, what the convolution reads
        self.hook_conv_out = HookPoint()  # [batch, pos, n_heads, d_head] the convolution's output
        self.hook_z = HookPoint()  # [batch, pos, n_heads, d_head] c * conv_out, out_proj's input by head
        self.hook_result = HookPoint()  # [batch, pos, n_heads, d_model] with cfg.use_attn_result

    # ---- forward ----
    def forward(self, x: Float[Tensor, "batch pos d_model"], cos: Tensor | None = None, sin: Tensor | None = None,
                masks: AttentionMasks | None = None, kv_cache: KVCache | None = None) -> Float[Tensor, "batch pos d_model"]:
        real = None if masks is None else masks.query_real
        if real is not None and x.shape[1] > 1:  # HF zeroes padding inputs (never on a one-token step)
            x = (x * real.to(x.device)[:, :, None]).to(x.dtype)
        batch, pos, _ = x.shape
        b, c, v = self.in_proj(x).chunk(3, dim=-1)
        heads = (batch, pos, self.n_heads, self.d_head)
        b = self.hook_b(b.reshape(heads))
        c = self.hook_c(c.reshape(heads))
        v = self.hook_x(v.reshape(heads))
        u = self.hook_conv_in(b * v).reshape(batch, pos, -1).transpose(1, 2)  # [batch, channels, pos]
        weight = self.conv.weight.squeeze(1)
        conv_state = None if kv_cache is None else kv_cache.conv_states[self.layer]
        if conv_state is not None and pos == 1:  # one decoding step: HF's in-place update of the state
            out = self._conv_update(u, conv_state, weight, self.conv.bias)
        else:
            if kv_cache is not None:
                kv_cache.conv_states[self.layer] = last_columns(u, self.kernel)
            out = self._conv(u, weight, self.conv.bias)
        if kv_cache is not None:
            kv_cache.positions[self.layer] += pos
        out = self.hook_conv_out(out.transpose(1, 2).reshape(heads))
        z = self.hook_z(c * out)
        if self.cfg.use_attn_result:
            result = self.hook_result(torch.einsum("bphd,hdm->bphm", z, self.W_O))
            return result.sum(dim=2) + self.b_O
        return self.out_proj(z.reshape(batch, pos, -1))


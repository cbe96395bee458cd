"""RMSNorm with TransformerLens hooks, numerically identical to HF's.

`hook_scale` is sqrt(mean(x^2) + eps) [..., 1] and `hook_normalized` is x / scale before the
weight, as in TransformerLens, so `ActivationCache.apply_ln_to_stack` works on our caches.
"""

from __future__ import annotations

import torch
from jaxtyping import Float
from torch import Tensor, nn

from vlens.hooks import HookPoint


class RMSNorm(nn.Module):
    """`source`: the HF norm module owning `weight`; where HF/accelerate offloaded it (disk or CPU
    offload, the parameter left on the meta device), the weight is read from there on each call."""

    def __init__(self, weight: nn.Parameter, eps: float, source: nn.Module | None = None):
        super().__init__()
        self.w = weight  # the HF parameter itself
        self.eps = eps
        self.__dict__["source"] = source  # not a submodule: its parameter is already ours
        self.hook_scale = HookPoint()  # [..., 1]
        self.hook_normalized = HookPoint()  # [..., d]

    @property
    def weight(self) -> nn.Parameter:
        return self.w

    def _weight(self) -> Tensor:
        """The weight to compute with: `w`, or the offloaded copy on the execution device."""
        if self.w.device.type != "meta":
            return self.w
        hook = getattr(self.source, "_hf_hook", None)
        weights = getattr(hook, "weights_map", None)
        if weights is None:
            raise ValueError("this RMSNorm's weight is on the meta device and no accelerate offload hook holds it")
        return weights["weight"].to(hook.execution_device)

    def forward(self, x: Float[Tensor, "... d"]) -> Float[Tensor, "... d"]:
        input_dtype = x.dtype
        x = x.to(torch.float32)
        variance = x.pow(2).mean(-1, keepdim=True) + self.eps
        if self.hook_scale.fwd_hooks or self.hook_scale.bwd_hooks:
            # someone reads or edits the scale: divide by the (possibly edited) value
            x = x / self.hook_scale(variance.sqrt())
        else:
            x = x * torch.rsqrt(variance)  # HF's exact arithmetic
        x = self.hook_normalized(x.to(input_dtype))
        return self._weight() * x

"""RMSNorm with TransformerLens hooks, numerically identical to HF's.

`hook_scale` is sqrt(mean(x^2) + eps) [..., 1] and `hook_normalized` is x / scale before the
weight, as in TransformerLens, so `ActivationCache.apply_ln_to_stack` works on our caches.

`RMSNormPre` normalizes only (TransformerLens's name for a norm whose weight was folded into
the next matrix). The decoder's final norm is one: its weight is applied by `Unembed`, so
`model.ln_final(x) @ model.W_U + model.b_U` gives the logits, as TransformerLens's own tools
expect (see `vlens.core.components.unembed`).
"""

from __future__ import annotations

import torch
from jaxtyping import Float
from torch import Tensor, nn

from vlens.core.hooks import HookPoint, is_observed


def compute_weight(weight: nn.Parameter, source: nn.Module | None) -> Tensor:
    """The weight to compute with: `weight`, or, where HF/accelerate offloaded it (disk or CPU
    offload, the parameter left on the meta device), the copy held by `source`'s offload hook
    (`source`: the HF module owning `weight`), on the execution device."""
    if weight.device.type != "meta":
        return weight
    hook = getattr(source, "_hf_hook", None)
    weights = getattr(hook, "weights_map", None)
    if weights is None or hook is None:
        raise RuntimeError("this norm's weight is on the meta device and no accelerate offload hook holds it")
    return weights["weight"].to(hook.execution_device)


class RMSNormPre(nn.Module):
    """x / sqrt(mean(x^2) + eps), computed in fp32 and cast back (HF's arithmetic), no weight."""

    def __init__(self, eps: float):
        super().__init__()
        self.eps = eps
        self.hook_scale = HookPoint()  # [..., 1]
        self.hook_normalized = HookPoint()  # [..., d]

    def forward(self, x: Float[Tensor, "... d"]) -> Float[Tensor, "... d"]:
        input_dtype = x.dtype
        x = x.to(torch.float32)
        variance = x.pow(2).mean(-1, keepdim=True) + self.eps
        if is_observed(self.hook_scale):
            # someone reads or edits the scale: divide by the (possibly edited) value
            x = x / self.hook_scale(variance.sqrt())
        else:
            x = x * torch.rsqrt(variance)  # HF's exact arithmetic
        return self.hook_normalized(x.to(input_dtype))

    def __getattr__(self, name: str):
        if name in ("w", "weight") and type(self) is RMSNormPre:
            raise AttributeError(
                f"This norm has no weight: its weight is folded into the next matrix (for the final norm, "
                f"model.W_U; the HF parameter itself is model.unembed.ln_final_w). `{name}` is not here."
            )
        return super().__getattr__(name)


class RMSNorm(RMSNormPre):
    """w * x / sqrt(mean(x^2) + eps); `w` is the HF parameter itself.

    `source`: the HF norm module owning `weight` (read for offloaded weights, see `compute_weight`).
    """

    def __init__(self, weight: nn.Parameter, eps: float, source: nn.Module | None = None):
        super().__init__(eps)
        self.w = weight  # the HF parameter itself
        self.__dict__["source"] = source  # not a submodule: its parameter is already ours

    @property
    def weight(self) -> nn.Parameter:
        return self.w

    def forward(self, x: Float[Tensor, "... d"]) -> Float[Tensor, "... d"]:
        return compute_weight(self.w, self.source) * super().forward(x)


class ZeroCenteredRMSNormPre(RMSNormPre):
    """x / sqrt(mean(x^2) + eps) computed in fp32 and returned in fp32, no weight: the first half of a
    zero-centred norm (Gemma's), whose ``1 + w`` the next module applies in fp32 and only then casts back
    (the final norm's, by `Unembed` with ``ln_final_offset=1``), so bf16 runs stay bit-identical to HF.
    `hook_scale` and `hook_normalized` are fp32."""

    def forward(self, x: Float[Tensor, "... d"]) -> Float[Tensor, "... d"]:
        hidden = x.to(torch.float32)
        variance = hidden.pow(2).mean(-1, keepdim=True) + self.eps
        if is_observed(self.hook_scale):
            hidden = hidden / self.hook_scale(variance.sqrt())
        else:
            hidden = hidden * torch.rsqrt(variance)  # HF's exact arithmetic
        return self.hook_normalized(hidden)


class ZeroCenteredRMSNorm(ZeroCenteredRMSNormPre):
    """(1 + w) * x / sqrt(mean(x^2) + eps), the weight stored as an offset from 1 (Qwen3.5; HF's
    "RMSNormZeroCentered", the Gemma norm), computed all in fp32 and cast back once, as HF does.

    `w` is the HF parameter itself (zeros at initialisation); `effective_weight` is 1 + w.
    `hook_normalized` is x / scale in fp32 (before the weight), `hook_scale` the scale.
    """

    def __init__(self, weight: nn.Parameter, eps: float, source: nn.Module | None = None):
        super().__init__(eps)
        self.w = weight
        self.__dict__["source"] = source  # not a submodule: its parameter is already ours

    @property
    def weight(self) -> nn.Parameter:
        return self.w

    @property
    def effective_weight(self) -> Tensor:
        """The factor the normalized input is multiplied by: 1 + w."""
        return 1.0 + compute_weight(self.w, self.source)

    def forward(self, x: Float[Tensor, "... d"]) -> Float[Tensor, "... d"]:
        hidden = super().forward(x)
        return (hidden * (1.0 + compute_weight(self.w, self.source).float())).type_as(x)

"""Hook points and hook-name helpers.

vlens reuses TransformerLens's `HookPoint` and `HookedRootModule`, so hooks, `run_with_hooks`,
`run_with_cache` and `ActivationCache` behave exactly as TransformerLens users expect.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor
from transformer_lens.hook_points import HookPoint as _TLHookPoint
from transformer_lens.HookedRootModule import HookedRootModule

__all__ = ["HookPoint", "HookResultError", "HookedRootModule", "act_name", "ATTENTION_PATTERN_HOOKS"]


class HookResultError(ValueError):
    """A forward hook returned something other than a tensor of its input's shape and dtype."""


def _hook_label(hook: Any) -> str:
    func = getattr(hook, "func", hook)  # functools.partial
    return getattr(func, "__qualname__", None) or getattr(func, "__name__", None) or repr(func)


def _checked(hook: Any, point: _TLHookPoint):
    """`hook` wrapped so a returned value must match the activation's shape, dtype and device.

    Returning None (TransformerLens: keep the activation, possibly edited in place) is fine. A
    wrong shape would otherwise be broadcast by the next operation (a [b, 1, q, k] pattern would
    give every head head 0's pattern) and a wrong dtype silently promoted.
    """

    def checked_hook(activation: Tensor, hook: Any = None) -> Any:
        result = inner(activation, hook=hook)
        if result is None or not isinstance(activation, Tensor):
            return result
        if not isinstance(result, Tensor):
            problem = f"a {type(result).__name__}"
        elif result.shape != activation.shape:
            problem = f"shape {tuple(result.shape)}"
        elif result.dtype != activation.dtype:
            problem = f"dtype {result.dtype}"
        elif result.device != activation.device:
            problem = f"device {result.device}"
        else:
            return result
        name = getattr(hook, "name", None) or point.name
        raise HookResultError(
            f"hook {_hook_label(inner)} on {name} returned {problem}, but the activation is a tensor of shape "
            f"{tuple(activation.shape)}, dtype {activation.dtype} on {activation.device}. Return a tensor of the "
            "same shape, dtype and device (e.g. edit it in place and return it, or return None)."
        )

    inner = hook
    checked_hook.__name__ = f"checked({_hook_label(hook)})"
    return checked_hook


class HookPoint(_TLHookPoint):
    """TransformerLens's `HookPoint`, with forward hook results checked (see `_checked`)."""

    def add_hook(self, hook: Any, dir: str = "fwd", *args: Any, **kwargs: Any):
        if dir == "fwd":
            hook = _checked(hook, self)
        return super().add_hook(hook, dir, *args, **kwargs)

# hooks that need the attention probabilities materialised (the explicit attention path)
ATTENTION_PATTERN_HOOKS = ("hook_attn_scores", "hook_pattern")

_BLOCK_LEVEL = {"resid_pre", "resid_mid", "resid_post", "attn_out", "mlp_out", "deepstack"}
_ATTN_LEVEL = {"q", "k", "v", "rot_q", "rot_k", "attn_scores", "pattern", "z", "result"}
_MLP_LEVEL = {"pre", "pre_linear", "post"}


def act_name(name: str, layer: int | None = None) -> str:
    """Full hook name from a short one, TransformerLens `get_act_name` style.

    >>> act_name("z", 3)
    'blocks.3.attn.hook_z'
    >>> act_name("resid_pre", 0)
    'blocks.0.hook_resid_pre'
    """
    short = name.removeprefix("hook_")
    if layer is None:
        return name if name.startswith(("blocks.", "vision.", "hook_")) else f"hook_{short}"
    if short in _BLOCK_LEVEL:
        return f"blocks.{layer}.hook_{short}"
    if short in _ATTN_LEVEL:
        return f"blocks.{layer}.attn.hook_{short}"
    if short in _MLP_LEVEL:
        return f"blocks.{layer}.mlp.hook_{short}"
    raise ValueError(
        f"Unknown activation name {name!r}. Known per-layer names: "
        f"{sorted(_BLOCK_LEVEL | _ATTN_LEVEL | _MLP_LEVEL)}"
    )

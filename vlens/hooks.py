"""Hook points and hook-name helpers.

vlens reuses TransformerLens's `HookPoint` and `HookedRootModule`, so hooks, `run_with_hooks`,
`run_with_cache` and `ActivationCache` behave exactly as TransformerLens users expect.
"""

from __future__ import annotations

from transformer_lens.hook_points import HookPoint
from transformer_lens.HookedRootModule import HookedRootModule

__all__ = ["HookPoint", "HookedRootModule", "act_name", "ATTENTION_PATTERN_HOOKS"]

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

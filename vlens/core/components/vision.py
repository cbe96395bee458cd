"""The HF vision tower (and projector / merger), kept as is and wrapped with hook points.

`vision.blocks.{i}.hook_resid_post` fires on each HF vision block's output through a
permanent PyTorch forward hook that routes the tensor through our `HookPoint` (identity
unless a hook is attached), so hooks can read or replace it. Layouts are the tower's own:
Qwen2-VL/Qwen2.5-VL blocks see [n_patches, width] for all images of the batch concatenated
(Qwen2.5-VL in its window-permuted order); CLIP (LLaVA) sees [n_images, n_patches + 1, width].
"""

from __future__ import annotations

from torch import Tensor, nn

from vlens.core.hooks import HookPoint, is_observed


class VisionBlockHooks(nn.Module):
    """Hook points of one vision-tower block."""

    def __init__(self):
        super().__init__()
        self.hook_resid_post = HookPoint()


class HookedVisionTower(nn.Module):
    """Wraps an HF vision tower; `encode` is supplied by the architecture adapter.

    Attributes:
        tower: the HF vision module itself (its parameters are the HF ones).
        projector: the HF projector when it lives outside the tower (LLaVA), else None.
        blocks: per-block hook points (`vision.blocks.{i}.hook_resid_post`).
        hook_image_embeds: [n_image_tokens, d_model], the features that replace the
            image placeholders (merger / projector output), all images of the batch concatenated.
    """

    def __init__(self, tower: nn.Module, hf_blocks: list[nn.Module], projector: nn.Module | None = None):
        super().__init__()
        self.tower = tower
        self.projector = projector
        block_hooks = [VisionBlockHooks() for _ in hf_blocks]
        self.blocks = nn.ModuleList(block_hooks)
        self.hook_image_embeds = HookPoint()
        for hf_block, hooks in zip(hf_blocks, block_hooks, strict=True):
            hf_block.register_forward_hook(_route_through(hooks.hook_resid_post))


def _route_through(hook_point: HookPoint):
    """A PyTorch forward hook that passes a block's output tensor through `hook_point`."""

    def forward_hook(module: nn.Module, inputs: tuple, output):
        if not is_observed(hook_point):
            return None  # nothing attached: leave the output untouched
        if isinstance(output, Tensor):
            return hook_point(output)
        if isinstance(output, tuple):  # e.g. (hidden_states, attn_weights)
            return (hook_point(output[0]), *output[1:])
        raise TypeError(f"Cannot hook vision block output of type {type(output).__name__}")

    return forward_hook


class VisionAttentionHooks(nn.Module):
    """Per-head hook point of one vision block's attention (`vision.blocks.{i}.attn.hook_z`)."""

    def __init__(self):
        super().__init__()
        self.hook_z = HookPoint()  # [..., n_heads, d_head]: the output projection's input, split by head


def attach_vision_head_hooks(vision: HookedVisionTower, out_projections: list[nn.Module], n_heads: int) -> None:
    """Expose each vision block's per-head attention output as `vision.blocks.{i}.attn.hook_z`.

    A permanent forward pre-hook on the block's attention output projection (an `nn.Linear`)
    splits its input [..., n_heads * d_head] into [..., n_heads, d_head] and routes it through the
    hook point (identity and no reshaping unless a hook is attached). Call before `setup()`.
    """
    for hooks, proj in zip(vision.blocks, out_projections, strict=True):
        hooks.attn = VisionAttentionHooks()
        proj.register_forward_pre_hook(_route_heads_through(hooks.attn.hook_z, n_heads))


def _route_heads_through(hook_point: HookPoint, n_heads: int):
    def pre_hook(module: nn.Module, args: tuple):
        if not is_observed(hook_point):
            return None
        z = args[0]
        heads = z.reshape(*z.shape[:-1], n_heads, z.shape[-1] // n_heads)
        return (hook_point(heads).reshape(z.shape), *args[1:])

    return pre_hook

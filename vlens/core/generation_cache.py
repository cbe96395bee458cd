"""Caching while generating: the activations of the prompt and of every decoding step, assembled into
one cache over the whole sequence, equal to a forward over prompt + generated tokens.

With the KV cache, the prompt runs once over all its positions and each decoding step over one new
position, so each hook fires once per forward with a slice of the sequence. `StepRecorder` keeps those
slices and concatenates them along the position axis: dimension 1 for ``[batch, pos, ...]`` hooks, the
query axis for ``hook_pattern`` / ``hook_attn_scores`` ``[batch, n_heads, query_pos, key_pos]``, whose
key axis is padded to the whole sequence (pattern 0, scores the mask value, exactly what a full forward
holds for keys a query cannot see; a sliding-window layer's keys are placed from the window's first
position). Hooks of the vision side (``vision.*``) and the DeepStack features (``[n_image_tokens,
d_model]``) fire only for the prompt and are kept as they are.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from vlens.core.components.attention import KVCache
from vlens.utils.errors import UserInputError

NamesFilter = str | Sequence[str] | Callable[[str], bool] | None

_LAYER = re.compile(r"blocks\.(\d+)\.")
_KEY_AXIS_HOOKS = ("hook_pattern", "hook_attn_scores")


def _prompt_only(name: str) -> bool:
    """Hooks that have no position axis of the text sequence: they fire for the prompt only."""
    return name.startswith("vision.") or name.endswith("hook_deepstack")


def resolve_names(names_filter: NamesFilter, hook_names: Sequence[str]) -> list[str]:
    """The hook names a TransformerLens-style `names_filter` selects (None: every hook but the attention
    scores, as `HookedVLM.run_with_cache`)."""
    if names_filter is None:
        chosen = [n for n in hook_names if not n.endswith("hook_attn_scores")]
    elif isinstance(names_filter, str):
        chosen = [n for n in hook_names if n == names_filter]
    elif callable(names_filter):
        chosen = [n for n in hook_names if names_filter(n)]
    elif isinstance(names_filter, Sequence):
        wanted = set(names_filter)
        unknown = sorted(wanted - set(hook_names))
        if unknown:
            raise UserInputError(f"generate(return_cache=True): names_filter names unknown hooks {unknown[:5]}; "
                                 "model.hook_dict lists the hook names.")
        chosen = [n for n in hook_names if n in wanted]
    else:
        raise UserInputError("generate: names_filter must be a hook name, a list of names or a function of the "
                             f"name, got a {type(names_filter).__name__}.")
    if not chosen:
        raise UserInputError(f"generate(return_cache=True): names_filter {names_filter!r} selects no hook; "
                             "model.hook_dict lists the hook names.")
    return chosen


class StepRecorder:
    """Records the chosen hooks at the prompt and every decoding step (see the module doc).

    names: the hook names to record; kv_cache: the decoding cache (where a sliding-window layer's keys
    start); device: where to keep the activations (None: where they were computed).
    """

    def __init__(self, names: Sequence[str], kv_cache: KVCache, device: str | torch.device | None = None):
        self.names = list(names)
        self.kv_cache = kv_cache
        self.device = device
        self.chunks: dict[str, list[tuple[int, Tensor]]] = {name: [] for name in self.names}

    def fwd_hooks(self) -> list[tuple[str, Callable[..., None]]]:
        """(name, hook) pairs that record every call of each hook."""
        return [(name, self._record) for name in self.names]

    def _record(self, activation: Tensor, hook: Any) -> None:
        name = hook.name
        offset = 0  # where this call's keys start in the sequence (a sliding window drops early ones)
        if name.endswith(_KEY_AXIS_HOOKS):
            match = _LAYER.match(name)
            if match is not None:
                offset = self.kv_cache.offset(int(match.group(1)))
        if _prompt_only(name):  # fires for the prompt only; a second call (another image) replaces it, as
            self.chunks[name] = []  # run_with_cache keeps the last one
        self.chunks[name].append((offset, activation.detach().to(self.device)))

    def assemble(self, total: int) -> dict[str, Tensor]:
        """One tensor per hook over `total` positions (prompt + every recorded step)."""
        out: dict[str, Tensor] = {}
        for name, chunks in self.chunks.items():
            if not chunks:
                continue  # the hook never fired (e.g. a vision hook with no image)
            if _prompt_only(name):
                out[name] = chunks[-1][1]
                continue
            axis = 2 if name.endswith(_KEY_AXIS_HOOKS) else 1
            if axis == 2:
                out[name] = torch.cat([_pad_keys(t, at, total, name) for at, t in chunks], dim=2)
            else:
                out[name] = torch.cat([t for _, t in chunks], dim=1)
            width = out[name].shape[axis]
            if width != total:
                raise RuntimeError(f"generate's cache: {name} covers {width} positions, the sequence {total}")
        return out


def _pad_keys(pattern: Tensor, start: int, total: int, name: str) -> Tensor:
    """[batch, heads, q, k] -> [batch, heads, q, total], the keys placed at [start, start + k)."""
    fill = 0.0 if name.endswith("hook_pattern") else torch.finfo(pattern.dtype).min
    full = pattern.new_full((*pattern.shape[:-1], total), fill)
    full[..., start:start + pattern.shape[-1]] = pattern
    return full

"""Hook points and hook-name helpers.

vlens reuses TransformerLens's `HookPoint` and `HookedRootModule`, so hooks, `run_with_hooks`,
`run_with_cache` and `ActivationCache` behave exactly as TransformerLens users expect.

Temporary forward hooks belong to the thread that added them (to its `ThreadToken`, never to its
thread id, which Python reuses for a later thread: a hook left by a finished thread would otherwise
run in the next thread that happens to get the same id); a forward in another thread
does not run them (it computes the model as if they were not there), and `reset_hooks` /
the end of a `hooks()` context in one thread removes only that thread's. Two threads can so
share one model, each with its own `run_with_hooks` / `run_with_cache`, without seeing each
other's patches or caches. Permanent hooks (``is_permanent=True``) and backward hooks (run by
autograd's own threads) apply to every thread. Hooks of a thread that has ended never run and are
dropped when the hook point next adds or removes hooks.
"""

from __future__ import annotations

import itertools
import re
import threading
import weakref
from numbers import Integral
from typing import Any, Literal

from torch import Tensor

from vlens.utils.errors import UserInputError
from vlens.utils.tl_modules import (
    HookedRootModule,
    get_act_name,
)
from vlens.utils.tl_modules import HookPoint as _TLHookPoint

__all__ = ["HookPoint", "HookResultError", "HookedRootModule", "ThreadToken", "act_name", "check_hook_pairs",
           "is_observed", "new_context_level", "thread_token", "traced_externally", "visible_hooks"]

OWNER_ATTRIBUTE = "vlens_owner"  # on a LensHandle: the ThreadToken of a temporary forward hook (None: every thread)
# hooks() levels are unique across threads (TransformerLens counts one shared depth, so two threads'
# contexts would remove each other's hooks or leave their own behind)
_levels = itertools.count(1_000_000)
_levels_lock = threading.Lock()


_generation = 0  # bumped whenever a hook is added or removed anywhere: torch.compile guards on it (see `hooks_generation`)


def hooks_generation() -> int:
    """A number that changes whenever any hook point gains or loses a hook (in any thread).

    A compiled forward reads it, so torch.compile guards on its value and retraces after a hook change:
    by default dynamo does not guard on module hooks (``skip_nnmodule_hook_guards``), so a graph traced
    without hooks would otherwise keep running without the hooks added later.
    """
    return _generation


def _bump_generation() -> None:
    global _generation
    with _levels_lock:
        _generation += 1


def new_context_level() -> int:
    """A context level no other `hooks()` context (in any thread) uses."""
    with _levels_lock:
        return next(_levels)


class ThreadToken:
    """Stands for one thread while it lives. Unlike `threading.get_ident()`, which Python hands to a
    later thread once this one ends, no other thread ever gets the same token (compare with ``is``)."""

    __slots__ = ("__weakref__", "thread")

    def __init__(self) -> None:
        self.thread = weakref.ref(threading.current_thread())

    def alive(self) -> bool:
        thread = self.thread()
        return thread is not None and thread.is_alive()


_tokens = threading.local()  # a new thread starts with an empty one, whatever its id


def thread_token() -> ThreadToken:
    """The current thread's `ThreadToken` (made on first use)."""
    token = getattr(_tokens, "token", None)
    if token is None:
        token = _tokens.token = ThreadToken()
    return token


def _owner(handle: Any) -> ThreadToken | None:
    return getattr(handle, OWNER_ATTRIBUTE, None)


def visible_hooks(handles: list) -> bool:
    """Whether any of a hook point's handles runs in the current thread."""
    if not handles:
        return False
    me = thread_token()
    return any(_owner(handle) is None or _owner(handle) is me for handle in handles)


def traced_externally(module: Any) -> bool:
    """Whether a tool that wraps the module's own ``forward`` is watching it now (nnsight's trace).

    nnsight puts a controller in the module's instance ``forward`` (inert outside a trace; its
    ``state.active()`` names the running trace). A hook point that is only called when something
    watches it (the attention pattern, a vision block's output, a norm's scale) must then be called,
    or the trace waits for a value that never comes (nnsight's `OutOfOrderError`). Any other
    instance-level ``forward`` on a hook point also counts as watching.
    """
    forward = module.__dict__.get("forward")
    if forward is None:
        return False
    active = getattr(getattr(forward, "state", None), "active", None)
    if not callable(active):
        return True
    try:
        return active()[0] is not None
    except Exception:  # another version's controller: watching, to be safe
        return True


def is_observed(hook_point: Any) -> bool:
    """Whether anything reads or edits `hook_point` in this thread's forward: a TransformerLens hook
    (`visible_hooks`), a backward hook, or an external tracer (`traced_externally`). Modules that skip
    work when nobody looks (the explicit attention path, the vision blocks' routing) ask this."""
    return bool(visible_hooks(hook_point.fwd_hooks) or hook_point.bwd_hooks or traced_externally(hook_point))


def check_hook_pairs(pairs: Any, which: str = "fwd_hooks") -> list:
    """`pairs` as a list of (hook name or name filter, function) pairs, as TransformerLens takes them; else one
    `UserInputError` saying which entry is wrong (before: "too many values to unpack" or "'int' object is not
    callable" from inside a forward)."""
    example = f"{which}=[('blocks.0.hook_resid_post', fn)] with fn(activation, hook)"
    if isinstance(pairs, (str, bytes, dict)) or not hasattr(pairs, "__iter__"):
        raise UserInputError(f"{which} must be a list of (hook name, function) pairs, got {type(pairs).__name__}: "
                             f"{example}")
    pairs = list(pairs)
    for i, pair in enumerate(pairs):
        if not isinstance(pair, (list, tuple)) or len(pair) != 2:
            raise UserInputError(f"{which}[{i}] must be a (hook name, function) pair, got {str(pair)[:60]!r}: {example}")
        if not callable(pair[1]):
            raise UserInputError(f"{which}[{i}]: the hook for {str(pair[0])[:60]!r} is a {type(pair[1]).__name__}, not a "
                                 f"function: {example}")
    return pairs


class HookResultError(ValueError):
    """A forward hook returned something other than a tensor of its input's shape and dtype."""


def _hook_label(hook: Any) -> str:
    func = getattr(hook, "func", hook)  # functools.partial
    return getattr(func, "__qualname__", None) or getattr(func, "__name__", None) or repr(func)


def _checked(hook: Any, point: _TLHookPoint, owner: ThreadToken | None = None):
    """`hook` wrapped so a returned value must match the activation's shape, dtype and device.

    Returning None (TransformerLens: keep the activation, possibly edited in place) is fine. A
    wrong shape would otherwise be broadcast by the next operation (a [b, 1, q, k] pattern would
    give every head head 0's pattern) and a wrong dtype silently promoted. With an `owner`
    thread, the hook runs only in that thread (another thread's forward passes it by).
    """

    def checked_hook(activation: Tensor, hook: Any = None) -> Any:
        if owner is not None and thread_token() is not owner:
            return None
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
    """TransformerLens's `HookPoint`, with forward hook results checked (see `_checked`) and temporary
    forward hooks bound to the thread that added them (see the module doc)."""

    def add_hook(self, hook: Any, dir: Literal["fwd", "bwd"] = "fwd", is_permanent: bool = False,
                 level: int | None = None, prepend: bool = False, alias_names: list[str] | None = None):
        owner = None if is_permanent or dir != "fwd" else thread_token()
        self.fwd_hooks = self._without_ended_threads(self.fwd_hooks)
        if dir == "fwd":
            hook = _checked(hook, self, owner)
        handle = super().add_hook(hook, dir, is_permanent=is_permanent, level=level, prepend=prepend,
                                  alias_names=alias_names)
        if handle is None:  # TransformerLens 3.x returns nothing; the new handle is first or last in the list
            handles = self.fwd_hooks if dir == "fwd" else self.bwd_hooks
            handle = handles[0] if prepend else handles[-1]
        _bump_generation()
        setattr(handle, OWNER_ATTRIBUTE, owner)
        return handle

    def forward(self, x: Any) -> Any:
        """The activation unchanged (hooks run around this call). Reading the hooks' generation here puts a
        guard on it in every compiled frame that calls a hook point, so torch.compile retraces those frames
        once a hook is added or removed (see `hooks_generation`)."""
        if _generation < 0:
            raise RuntimeError("the hooks' generation counter went negative")
        return x

    def remove_hooks(self, dir: Literal["fwd", "bwd", "both"] = "fwd", including_permanent: bool = False,
                     level: int | None = None) -> None:
        """TransformerLens's `remove_hooks`, leaving other threads' temporary hooks in place."""
        if dir not in ("fwd", "bwd", "both"):
            raise UserInputError(f"Invalid direction {dir}")
        me = thread_token()

        def kept(handles: list) -> list:
            keep = []
            for handle in self._without_ended_threads(handles):
                owner = _owner(handle)
                if (owner is not None and owner is not me) or (handle.is_permanent and not including_permanent) \
                        or (level is not None and handle.context_level != level):
                    keep.append(handle)
                else:
                    handle.hook.remove()
            return keep

        _bump_generation()
        if dir in ("fwd", "both"):
            self.fwd_hooks = kept(self.fwd_hooks)
        if dir in ("bwd", "both"):
            self.bwd_hooks = kept(self.bwd_hooks)

    @staticmethod
    def _without_ended_threads(handles: list) -> list:
        """`handles` less the temporary hooks of threads that have ended (removed from the module)."""
        keep = []
        for handle in handles:
            owner = _owner(handle)
            if owner is not None and not owner.alive():
                handle.hook.remove()
            else:
                keep.append(handle)
        return keep



# every hook name of the language side (vision.* names depend on the family and pass through)
_TOP_LEVEL = {"hook_embed", "hook_inputs_embeds", "ln_final.hook_scale", "ln_final.hook_normalized"}
_PER_LAYER = re.compile(
    r"blocks\.\d+\.("
    r"hook_(resid_pre|resid_mid|resid_post|attn_out|mlp_out|deepstack)"
    r"|ln[12](_post)?\.hook_(scale|normalized)"
    r"|attn\.hook_(q|k|v|rot_q|rot_k|attn_scores|pattern|z|result"
    r"|output_gate|beta|g|recurrent_state|core_out|b|c|x|conv_in|conv_out)"
    r"|mlp\.hook_(pre|pre_linear|post|router_logits|expert_weights|expert_indices|expert_out|routed_out"
    r"|shared_gate|shared_out)"
    r"|mlp\.shared_expert\.hook_(pre|pre_linear|post))"
)
# short names vlens adds on top of TransformerLens's
_VLENS_ALIASES = {"image_embeds": "vision.hook_image_embeds", "image_features": "vision.hook_image_features"}
# TransformerLens names with no counterpart here, and what to use instead
_MISSING = {
    "hook_pos_embed": "rotary models have no positional embedding hook",
    "mlp.hook_mid": "hook_mid exists only in SoLU MLPs",
    "hook_attn_in": "use blocks.{l}.ln1.hook_normalized",
    "hook_q_input": "use blocks.{l}.attn.hook_q", "hook_k_input": "use blocks.{l}.attn.hook_k",
    "hook_v_input": "use blocks.{l}.attn.hook_v",
    "hook_mlp_in": "use blocks.{l}.hook_resid_mid or blocks.{l}.ln2.hook_normalized",
}


def act_name(name: str, layer: int | None = None, layer_type: str | None = None) -> str:
    """Full hook name from a short one, with TransformerLens `get_act_name` semantics.

    Accepts everything `transformer_lens.utils.get_act_name` does that names a vlens hook:
    aliases ("attn" -> pattern, "attn_logits", "key"/"query"/"value", "mlp_pre"/"mlp_post"),
    the compact forms ("k6", "scale4ln1"), `layer_type` ("ln1", "ln2", "a", "m") and full
    names; plus "deepstack", "inputs_embeds", "image_embeds" and "image_features".

    >>> act_name("z", 3)
    'blocks.3.attn.hook_z'
    >>> act_name("mlp_post", 0)
    'blocks.0.mlp.hook_post'
    >>> act_name("normalized", 2, "ln1")
    'blocks.2.ln1.hook_normalized'

    Raises:
        UserInputError: a name vlens has no hook for (e.g. "pos_embed", "mid", "attn_in").
    """
    if not isinstance(name, str):
        raise UserInputError(f"act_name takes a string name, got {name!r}.")
    if layer is not None and (isinstance(layer, bool) or not isinstance(layer, Integral) or layer < 0):
        raise UserInputError(f"act_name: layer must be a non-negative int, got {layer!r}.")
    if layer is None and layer_type is None and name.removeprefix("hook_") in _VLENS_ALIASES:
        return _VLENS_ALIASES[name.removeprefix("hook_")]
    full = get_act_name(name, layer, layer_type)
    if full in _TOP_LEVEL or _PER_LAYER.fullmatch(full) or full.startswith("vision."):
        return full
    why = next((reason for suffix, reason in _MISSING.items() if full.endswith(suffix)), None)
    raise UserInputError(
        f"act_name({name!r}, {layer!r}) -> {full!r}, which is not a vlens hook"
        + (f" ({why})" if why else "")
        + ". Per-layer names: resid_pre/mid/post, attn_out, mlp_out, deepstack, q, k, v, rot_q, rot_k, attn_scores, "
        "pattern, z, result, pre, pre_linear, post, scale/normalized (with ln1/ln2, and ln1_post/ln2_post where "
        "the family has post-sublayer norms); model.hook_dict lists all."
    )

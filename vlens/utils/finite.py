"""Non-finite numbers (NaN, inf) in activations and results: detect, locate, report.

One NaN weight makes every later activation NaN, and `argmax` / comparisons then turn NaN
logits into confident-looking tokens, ranks and rates. Every analysis therefore checks its
logits, and where they are not finite it

- puts NaN in the result (never a rank, rate, token or class computed from NaN),
- warns with `NonFiniteWarning`, naming the first hook point (layer) and positions where the
  model's activations stop being finite (`locate_non_finite`),
- and the command line exits with status 3 after writing the results, unless ``--allow-nan``.

Result files are JSON without NaN: every non-finite number is written as ``null``
(`json_safe`, then ``json.dumps(..., allow_nan=False)``).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch is imported where it is used, so the CLI can import this module cheaply
    from torch import Tensor
    from transformer_lens.HookedRootModule import HookedRootModule

# exit status of a command whose results hold non-finite values (without --allow-nan)
NON_FINITE_EXIT = 3
# attention scores hold -inf at masked entries by design: never a sign of trouble
_SKIP_HOOKS = ("hook_attn_scores",)
_collectors: list[list[str]] = []  # open `collect_non_finite` blocks


class NonFiniteWarning(RuntimeWarning):
    """Activations or logits were NaN / inf; the affected results are NaN."""


def finite_rows(values: Tensor, dims: int = 1) -> Tensor:
    """bool [...]: True where all of the last `dims` dimensions of `values` are finite."""
    import torch

    ok = torch.isfinite(values)
    for _ in range(dims):
        ok = ok.all(-1)
    return ok


def _indices_text(index: Tensor, limit: int = 6) -> str:
    items = [", ".join(str(int(i)) for i in row) for row in index[:limit]]
    more = f" (+{len(index) - limit} more)" if len(index) > limit else ""
    return "; ".join(f"({item})" for item in items) + more


def describe_non_finite(name: str, values: Tensor, leading: int = 2) -> str:
    """'<name>: NaN at (row, position) (0, 5); (0, 6) ...' for the first `leading` dims."""
    import torch

    bad = ~torch.isfinite(values.detach())
    kinds = "NaN" if bool(torch.isnan(values).any()) else "inf"
    if torch.isnan(values).any() and torch.isinf(values).any():
        kinds = "NaN and inf"
    flat = bad
    for _ in range(max(values.ndim - leading, 0)):
        flat = flat.any(-1)
    return f"{name}: {kinds} at {_indices_text(flat.nonzero())}"


def locate_non_finite(model: HookedRootModule, inputs: Any, fwd_hooks: Sequence = ()) -> str | None:
    """Run `inputs` once more and name the first hook point (in execution order) whose
    activation is not finite, with the (batch row, position) indices where it is not; None if
    the whole forward is finite. `fwd_hooks` are the hooks the analysis ran with."""
    import torch

    found: list[str] = []

    def watch(activation: Tensor, hook) -> None:
        if not found and isinstance(activation, torch.Tensor) and activation.is_floating_point() \
                and not bool(torch.isfinite(activation).all()):
            found.append(describe_non_finite(hook.name, activation))

    names = [n for n in model.hook_dict if not n.endswith(_SKIP_HOOKS)]
    with torch.no_grad(), model.hooks(fwd_hooks=[*fwd_hooks, *[(n, watch) for n in names]]):
        logits = model(inputs)
    if found:
        return found[0]
    if not bool(torch.isfinite(logits).all()):
        return describe_non_finite("logits", logits)
    return None


def warn_non_finite(what: str, detail: str, model: HookedRootModule | None = None, inputs: Any = None,
                    fwd_hooks: Sequence = (), stacklevel: int = 2) -> str:
    """Warn (`NonFiniteWarning`) that `what` is NaN for `detail`; with a model and inputs, also
    name where the activations first stop being finite. Returns the message."""
    message = f"{what}: non-finite values ({detail}); they are NaN in the results"
    if model is not None and inputs is not None:
        where = locate_non_finite(model, inputs, fwd_hooks)
        if where is not None:
            message += f". First non-finite activation: {where}"
    for messages in _collectors:
        messages.append(message)
    warnings.warn(message, NonFiniteWarning, stacklevel=stacklevel + 1)
    return message


@contextmanager
def collect_non_finite() -> Iterator[list[str]]:
    """Collect the messages of every `warn_non_finite` inside the block (the warnings are still
    issued): ``with collect_non_finite() as problems: ...; if problems: ...``."""
    messages: list[str] = []
    _collectors.append(messages)
    try:
        yield messages
    finally:
        _collectors.remove(messages)


def add_allow_nan_argument(parser) -> None:
    """The ``--allow-nan`` flag of every analysis command."""
    parser.add_argument("--allow-nan", action="store_true",
                        help="exit 0 even if activations or logits were NaN/inf (affected results are null in "
                             f"the output); without it such a run still writes its results, then exits {NON_FINITE_EXIT}")


def json_safe(value: Any) -> Any:
    """`value` with tensors turned into lists and every NaN / inf float into None (JSON null)."""
    if hasattr(value, "detach") and hasattr(value, "tolist"):  # a torch tensor
        value = value.detach().cpu().tolist()
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {key: json_safe(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(item) for item in value]
    if hasattr(value, "item") and callable(value.item) and getattr(value, "ndim", 1) == 0:  # numpy scalars
        return json_safe(value.item())
    return value


__all__ = [
    "NON_FINITE_EXIT", "NonFiniteWarning", "add_allow_nan_argument", "collect_non_finite", "describe_non_finite",
    "finite_rows", "json_safe", "locate_non_finite", "warn_non_finite",
]

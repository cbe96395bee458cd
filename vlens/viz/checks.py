"""Input checks shared by the viz functions: plain tensors, lists or arrays in, clear errors out."""

from __future__ import annotations

from collections.abc import Sequence
from typing import overload

import numpy as np
import torch
from torch import Tensor

from vlens.utils.errors import UserInputError


def as_float_tensor(values, name: str, ndim: int | tuple[int, ...]) -> Tensor:
    """Convert a tensor / numpy array / nested list to a float32 CPU tensor of the given rank.

    Any dtype (bf16, half, int) is accepted; the result is detached, so figures never hold graphs.
    """
    try:
        tensor = values.detach() if isinstance(values, Tensor) else torch.as_tensor(np.asarray(values))
    except (TypeError, ValueError) as error:
        raise TypeError(f"{name} must be a tensor, numpy array or nested list of numbers") from error
    allowed = (ndim,) if isinstance(ndim, int) else ndim
    if tensor.ndim not in allowed:
        wanted = " or ".join(f"{n}-D" for n in allowed)
        raise UserInputError(f"{name} must be {wanted}, got shape {tuple(tensor.shape)}")
    return tensor.to(device="cpu", dtype=torch.float32)


def as_grid(grid: Sequence[int] | Tensor, name: str = "grid") -> tuple[int, int]:
    """Validate a merged-patch grid given as (rows, cols) and return it as two ints.

    A (t, rows, cols) triple as in `image_grid_thw` is accepted when t == 1.
    """
    values = [int(v) for v in (grid.tolist() if isinstance(grid, Tensor) else grid)]
    if len(values) == 3 and values[0] == 1:
        values = values[1:]
    if len(values) != 2 or min(values) < 1:
        raise UserInputError(f"{name} must be (rows, cols) with positive sizes, got {tuple(values)}")
    return values[0], values[1]


@overload
def check_labels(labels: Sequence[str], expected: int, name: str) -> list[str]: ...
@overload
def check_labels(labels: Sequence[str] | None, expected: int, name: str) -> list[str] | None: ...
def check_labels(labels: Sequence[str] | None, expected: int, name: str) -> list[str] | None:
    """Check that an optional list of labels has one entry per row/column."""
    if labels is None:
        return None
    labels = [str(label) for label in labels]
    if len(labels) != expected:
        raise UserInputError(f"{name} has {len(labels)} entries, expected {expected}")
    return labels

"""Items built from their index alone, so that each process builds only the items it runs.

Generated data (pairs, task samples) must not depend on how many processes share a run: item
i of a generated set is a function of the seed and i only. `LazyItems(n, build)` is the
sequence ``[build(0), ..., build(n - 1)]`` that calls `build` only for the items read.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar, overload

from vlens.utils.errors import UserInputError

T = TypeVar("T")


class LazyItems(Sequence[T]):
    """A read-only sequence of `n` items, item i being `build(i)` (computed when read, not kept)."""

    def __init__(self, n: int, build: Callable[[int], T]):
        if n < 0:
            raise UserInputError(f"LazyItems needs n >= 0, got {n}")
        self.n, self.build = n, build

    def __len__(self) -> int:
        return self.n

    @overload
    def __getitem__(self, index: int) -> T: ...

    @overload
    def __getitem__(self, index: slice) -> list[T]: ...

    def __getitem__(self, index: Any):
        if isinstance(index, slice):
            return [self.build(i) for i in range(*index.indices(self.n))]
        if index < 0:
            index += self.n
        if not 0 <= index < self.n:
            raise IndexError(f"item {index} of {self.n}")
        return self.build(index)

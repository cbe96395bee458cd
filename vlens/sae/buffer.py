"""A shuffling buffer over an activation stream, with a state that checkpoints and resumes exactly.

The buffer holds up to `capacity` activations. When fewer than half remain it reads chunks (in
order, wrapping around at the end: a new epoch) until it is full again and shuffles the lot with
its own generator; batches are drawn from the front. Its state (the held activations, the next
chunk, the epoch, the generator) is plain tensors and ints, so a resumed buffer yields the same
batches as one that never stopped.
"""

from __future__ import annotations

from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor

from vlens.sae.activations import ActivationStream
from vlens.utils.errors import UserInputError
from vlens.utils.validation import check_count


class ShuffleBuffer:
    def __init__(self, stream: ActivationStream, capacity: int, seed: int = 0):
        self.stream, self.capacity = stream, check_count(capacity, "buffer capacity")
        self.generator = torch.Generator().manual_seed(seed)
        self.held: Tensor | None = None
        self.next_chunk, self.epoch, self.tokens_read = 0, 0, 0

    def refill(self) -> None:
        # the state changes only once the chunks are read: a failing read leaves the buffer as it was
        parts = [] if self.held is None else [self.held]
        have = 0 if self.held is None else self.held.shape[0]
        (next_chunk, epoch, tokens_read) = (self.next_chunk, self.epoch, self.tokens_read)
        empty = 0
        while have < self.capacity:
            chunk = self.stream.chunk(next_chunk).acts
            next_chunk += 1
            if next_chunk == self.stream.n_chunks:
                next_chunk, epoch = 0, epoch + 1
            if chunk.shape[0] == 0:
                empty += 1
                if empty >= self.stream.n_chunks:
                    raise UserInputError("the activation stream yields no activations (no token at the chosen "
                                         "positions?): choose other positions or examples.")
                continue
            empty = 0
            parts.append(chunk.float())
            have += chunk.shape[0]
            tokens_read += chunk.shape[0]
        pool = torch.cat(parts)
        self.held = pool[torch.randperm(pool.shape[0], generator=self.generator)]
        (self.next_chunk, self.epoch, self.tokens_read) = (next_chunk, epoch, tokens_read)

    def next_batch(self, size: int) -> Float[Tensor, "size d_in"]:
        """`size` shuffled activations."""
        if size > self.capacity // 2:
            raise UserInputError(f"batch of {size} activations needs a buffer of at least {2 * size} (got {self.capacity}).")
        if self.held is None or self.held.shape[0] < max(size, self.capacity // 2):
            self.refill()
        assert self.held is not None
        batch, self.held = self.held[:size], self.held[size:]
        return batch

    def state_dict(self) -> dict[str, Any]:
        return {"held": self.held, "next_chunk": self.next_chunk, "epoch": self.epoch,
                "tokens_read": self.tokens_read, "generator": self.generator.get_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.held = state["held"]
        self.next_chunk, self.epoch, self.tokens_read = state["next_chunk"], state["epoch"], state["tokens_read"]
        self.generator.set_state(state["generator"])

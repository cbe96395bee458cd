"""`Sharding`: which process this is, and `map`, the one way vlens splits work across processes.

A method describes its work as a list of units (a batch of examples, a chunk of patch
conditions, ...) that are independent and each formed exactly as the single-process run forms
them. `Sharding.map(units, fn)` gives process r the units r, r + N, r + 2N, ... (N processes:
units of one kind, e.g. the patch conditions of one layer, are listed together, and their
costs differ, so striding balances the work where contiguous shares would not), runs `fn`
on its share, and gathers every result, in unit order, to every process. Because each unit is
the same batch the single-process run computes, the numbers are the same bits, and the
method assembles them exactly as before.

Failure: if `fn` raises on any process, every process raises `DistributedRunError` naming
the failed rank(s) and the error, after exchanging status (no process is left waiting). A
process that dies outright (killed, out of memory) breaks the collective: the others raise
`DistributedRunError` as soon as the transport notices, at the latest after the process
group's timeout. Finished units stay in the run's `UnitStore`, if it has one, for a resume.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from tqdm.auto import tqdm

from vlens.parallel.store import UnitStore
from vlens.parallel.teardown import mark_peer_lost
from vlens.utils.errors import UserInputError

logger = logging.getLogger(__name__)


class DistributedRunError(RuntimeError):
    """A sharded run failed on some process; no result was produced."""


def shard_indices(n_units: int, world_size: int, rank: int) -> range:
    """The units `rank` runs: every `world_size`-th from `rank` (shares differ by at most one unit,
    and each holds units from the whole list, so cheap and costly kinds of units are mixed)."""
    if world_size < 1 or not 0 <= rank < world_size:
        raise UserInputError(f"rank {rank} is not in a world of {world_size} processes")
    return range(rank, n_units, world_size)


@dataclass
class Sharding:
    """The process layout of a run and how its work is split.

    The default, `Sharding()`, is one process: `map` is a plain loop. Under `torchrun` use
    `vlens.parallel.from_env()`; with a process group you built, `Sharding.from_group(group)`.

    Attributes:
        rank, world_size: this process and how many there are (in `group`).
        local_rank: this process's index on its machine (picks its GPU: ``cuda:{local_rank}``).
        group: the torch.distributed process group (None: the default group).
        store: where finished units are kept for resuming (None: nowhere).
    """

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    group: Any = None
    store: UnitStore | None = None
    _stages: int = field(default=0, repr=False)

    @classmethod
    def from_group(cls, group: Any = None, local_rank: int | None = None, store: UnitStore | None = None) -> Sharding:
        """The layout of an initialised torch.distributed process group (default: the world)."""
        import os

        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            raise UserInputError("torch.distributed is not initialised: call torch.distributed.init_process_group "
                             "first, or use vlens.parallel.from_env() under torchrun")
        rank = dist.get_rank(group)
        if local_rank is None:
            local_rank = int(os.environ.get("LOCAL_RANK", rank))
        return cls(rank=rank, world_size=dist.get_world_size(group), local_rank=local_rank, group=group,
                   store=store)

    @property
    def is_main(self) -> bool:
        """Rank 0: the process that shows progress and writes the output."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    def share(self, n_units: int) -> range:
        """The unit indices this process runs."""
        return shard_indices(n_units, self.world_size, self.rank)

    def progress(self, wanted: bool = True) -> bool:
        """Whether this process should show a progress bar (only the main one does)."""
        return wanted and self.is_main

    # ------------------------------------------------------------------ work
    def map(self, units: Sequence[Any], fn: Callable[[Any], Any], desc: str = "units",
            progress: bool = True) -> list[Any]:
        """`[fn(u) for u in units]`, each process running its share; every process gets the full list.

        Units must be independent and identical on every process (same order); with a store,
        results must be plain data (see `vlens.parallel.store`). Raises `DistributedRunError`
        on every process if any process fails.
        """
        units = list(units)
        stage = None
        if self.store is not None:
            stage = self.store.stage(self._stages, desc, len(units))
        self._stages += 1
        mine = self.share(len(units))
        if stage is not None and self.is_main:
            done = stage.count()
            if done:
                logger.info("%s: resuming, %d of %d units already done in %s", desc, done, len(units), stage.folder)
        results: dict[int, Any] = {}
        error: BaseException | None = None
        label = desc if not self.distributed else f"{desc} (rank 0 of {self.world_size})"
        with tqdm(total=len(mine), desc=label, disable=not self.progress(progress)) as bar:
            try:
                for index in mine:
                    if stage is not None and stage.has(index):
                        results[index] = stage.load(index)
                    else:
                        results[index] = fn(units[index])
                        if stage is not None:
                            stage.save(index, results[index])
                    bar.update(1)
            except DistributedRunError:  # stopped by torchrun (SIGTERM): the others are going down too
                raise
            except Exception as caught:  # reported to every process below, then raised
                if not self.distributed:
                    raise
                error = caught
        if not self.distributed:
            return [results[i] for i in range(len(units))]
        status = self._all_gather((self.rank, None if error is None else f"{type(error).__name__}: {error}"), desc)
        failed = [(rank, message) for rank, message in status if message is not None]
        if failed:
            detail = "; ".join(f"rank {rank}: {message}" for rank, message in failed)
            raise DistributedRunError(f"{desc} failed on {len(failed)} of {self.world_size} processes ({detail})."
                                      f"{self.resume_hint()}") from error
        merged: dict[int, Any] = {}
        for part in self._all_gather(results, desc):
            merged.update(part)
        return [merged[i] for i in range(len(units))]

    def broadcast(self, obj: Any = None, desc: str = "broadcast") -> Any:
        """Rank 0's `obj` on every process (e.g. something only rank 0 computed)."""
        if not self.distributed:
            return obj
        import torch.distributed as dist

        box = [obj if self.is_main else None]
        self._collective(lambda: dist.broadcast_object_list(box, src=self._global_rank(0), group=self.group), desc)
        return box[0]

    def barrier(self, desc: str = "barrier") -> None:
        if self.distributed:
            import torch.distributed as dist

            self._collective(lambda: dist.barrier(group=self.group), desc)

    # ------------------------------------------------------------------ collectives
    def resume_hint(self) -> str:
        if self.store is None:
            return ""
        return (f" Finished units are kept in {self.store.folder}: rerun the same command (with any number of "
                "processes) to resume from them.")

    def _global_rank(self, group_rank: int) -> int:
        import torch.distributed as dist

        return group_rank if self.group is None else dist.get_global_rank(self.group, group_rank)

    def _all_gather(self, obj: Any, desc: str) -> list[Any]:
        import torch.distributed as dist

        out: list[Any] = [None] * self.world_size
        self._collective(lambda: dist.all_gather_object(out, obj, group=self.group), desc)
        return out

    def _collective(self, call: Callable[[], Any], desc: str) -> Any:
        """Run a collective; a lost peer becomes a DistributedRunError saying what happened."""
        try:
            return call()
        except RuntimeError as error:  # gloo / nccl report a dead or silent peer as RuntimeError subclasses
            mark_peer_lost()  # the broken group must not be torn down at exit
            detail = " ".join(str(error).split())
            raise DistributedRunError(
                f"{desc}: rank {self.rank} lost contact with another process of this run (it was killed, ran out "
                f"of memory, or did not answer within the process group's timeout; torchrun's summary names it): "
                f"{detail}. No result was written.{self.resume_hint()}") from error

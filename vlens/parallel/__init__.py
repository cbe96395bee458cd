"""Sharded runs on `torch.distributed`: split work units across processes, gather, resume.

    sharding = vlens.parallel.from_env()              # under torchrun; Sharding() = one process
    result = patch_layer_head(model, batch, options=SweepOptions(sharding=sharding))  # every rank: the full result
    if sharding.is_main: result.save("heads.json")

Each method lists its work as units formed exactly as its single-process run forms them
(batches of examples, chunks of patch conditions), `Sharding.map` runs each process's
share (every N-th unit) and gathers the results in unit order, so a run on N processes gives the
numbers of the run on one. See CONTRIBUTING.md ("Sharded runs") for the design.
"""

from vlens.parallel.items import LazyItems
from vlens.parallel.launch import from_env, launched_by_torchrun, rank_device, stop_on_sigterm
from vlens.parallel.options import SweepOptions
from vlens.parallel.sharding import DistributedRunError, Sharding, shard_indices
from vlens.parallel.store import UnitStore

__all__ = [
    "DistributedRunError",
    "LazyItems",
    "Sharding",
    "SweepOptions",
    "UnitStore",
    "from_env",
    "launched_by_torchrun",
    "rank_device",
    "shard_indices",
    "stop_on_sigterm",
]

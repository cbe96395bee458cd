"""A process of a 2-process gloo group for tests/unit/test_parallel.py (started with spawn, no torchrun)."""

from __future__ import annotations

import json
import os
import signal
from datetime import timedelta
from pathlib import Path

TIMEOUT_S = float(os.environ.get("VLENS_TEST_DIST_TIMEOUT_S", "600"))  # the group's timeout on every collective


def worker(rank: int, world_size: int, init_file: str, out_dir: str, store_dir: str) -> None:
    import torch
    import torch.distributed as dist

    from vlens.parallel import DistributedRunError, Sharding, UnitStore
    from vlens.parallel.teardown import register_exit_handlers

    torch.set_num_threads(1)
    # generous: on a loaded machine one process may start, import or reach a collective minutes after the
    # other; a killed peer is noticed when its sockets close, not by this timeout
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=TIMEOUT_S))
    register_exit_handlers()  # as vlens.parallel.from_env does: after a lost peer, exit 1 without gloo's teardown
    sharding = Sharding.from_group()
    report: dict = {"rank": sharding.rank, "world_size": sharding.world_size}
    calls: list[int] = []

    def square(unit: int) -> int:
        calls.append(unit)
        return unit * unit

    report["squares"] = sharding.map(list(range(7)), square, desc="squares", progress=False)
    report["calls"] = calls
    try:
        sharding.map(range(4), lambda u: 1 // (u - 3), desc="failing", progress=False)
    except DistributedRunError as error:
        report["failing"] = str(error)
    report["broadcast"] = sharding.broadcast({"from": sharding.rank})
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(report))

    # a process killed in the middle of its share (rank 1 runs units 1, 3, 5, 7: dies at 5)
    sharding = Sharding.from_group(store=UnitStore(store_dir, {"run": "killed"}))  # its first stage

    def unit(u: int):
        if sharding.rank == 1 and u == 5:
            os.kill(os.getpid(), signal.SIGKILL)
        return torch.tensor([float(u)])

    try:
        sharding.map(range(8), unit, desc="killed", progress=False)
        Path(out_dir, f"killed{rank}.txt").write_text("finished without error")
    except DistributedRunError as error:
        Path(out_dir, f"killed{rank}.txt").write_text(str(error))

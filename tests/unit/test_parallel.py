"""vlens.parallel: splitting, resume files, and a real 2-process gloo group (failures included)."""

from __future__ import annotations

import json
import multiprocessing
import time

import pytest
import torch

from vlens.parallel import LazyItems, Sharding, UnitStore, shard_indices
from vlens.parallel.launch import rank_device


def test_shards_cover_every_unit_once_and_mix_the_list():
    for n in range(0, 12):
        for world in range(1, 5):
            shares = [list(shard_indices(n, world, r)) for r in range(world)]
            assert sorted(i for s in shares for i in s) == list(range(n))
            sizes = [len(s) for s in shares]
            assert max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)
    assert list(shard_indices(7, 2, 1)) == [1, 3, 5]
    with pytest.raises(ValueError, match="rank 2 is not in a world of 2"):
        shard_indices(4, 2, 2)


def test_single_process_map_is_a_loop_and_resumes_from_the_store(tmp_path):
    store = UnitStore(tmp_path / "units", {"seed": 0})
    calls = []

    def fn(u):
        calls.append(u)
        if u == 3 and len(calls) == 4:
            raise RuntimeError("stopped")
        return {"u": torch.tensor([u]), "label": f"unit {u}"}

    with pytest.raises(RuntimeError, match="stopped"):
        Sharding(store=store).map(range(5), fn, progress=False)
    assert calls == [0, 1, 2, 3]
    calls.clear()
    out = Sharding(store=UnitStore(tmp_path / "units", {"seed": 0})).map(range(5), fn, progress=False)
    assert calls == [3, 4]  # units 0..2 come from the store
    assert [int(o["u"]) for o in out] == [0, 1, 2, 3, 4] and out[2]["label"] == "unit 2"


def test_store_refuses_other_settings_and_other_stages(tmp_path):
    UnitStore(tmp_path / "u", {"seed": 0, "mode": "a"}).stage(0, "sweep", 4)
    with pytest.raises(ValueError, match="differ in mode, seed"):
        UnitStore(tmp_path / "u", {"seed": 1, "mode": "b"}).stage(0, "sweep", 4)
    with pytest.raises(ValueError, match="written for 4 units of 'sweep'"):
        UnitStore(tmp_path / "u", {"seed": 0, "mode": "a"}).stage(0, "sweep", 5)
    with pytest.raises(TypeError, match="plain data"):
        UnitStore(tmp_path / "u", {"seed": 0, "mode": "a"}).stage(0, "sweep", 4).save(0, object())


def test_lazy_items_build_only_what_is_read():
    built = []
    items = LazyItems(6, lambda i: built.append(i) or i * 10)
    assert len(items) == 6 and items[2:4] == [20, 30] and items[-1] == 50
    assert built == [2, 3, 5]
    with pytest.raises(IndexError):
        items[6]


def test_rank_device():
    assert rank_device(Sharding(), None) is None and rank_device(Sharding(), "cuda:3") == "cuda:3"
    two = Sharding(rank=1, world_size=2, local_rank=1)
    if not torch.cuda.is_available():
        assert rank_device(two, None) == "cpu"
        with pytest.raises(ValueError, match="CUDA is not available"):
            rank_device(two, "cuda")
    with pytest.raises(ValueError, match="each process takes its own GPU"):
        rank_device(two, "cuda:0")


def test_two_gloo_processes_gather_fail_together_and_resume(tmp_path):
    from tests.helpers.parallel_workers import TIMEOUT_S, worker

    context = multiprocessing.get_context("spawn")
    store = tmp_path / "units"
    processes = [context.Process(target=worker, args=(rank, 2, str(tmp_path / "init"), str(tmp_path), str(store)))
                 for rank in range(2)]
    for process in processes:
        process.start()
    try:
        # no fixed wall-clock budget: the processes end by themselves (a peer's failure or death reaches the
        # other through gloo; the group's own timeout, TIMEOUT_S, bounds any wait), so wait that long and more
        deadline = time.monotonic() + 2 * TIMEOUT_S + 300
        for process in processes:
            process.join(timeout=max(1.0, deadline - time.monotonic()))
        assert all(process.exitcode is not None for process in processes), "a process never ended"
    finally:
        for process in processes:
            if process.is_alive():
                process.kill()
                process.join()
    assert processes[1].exitcode == -9  # killed on purpose
    # the survivor ends with status 1 (vlens.parallel.teardown), never SIGABRT from gloo's teardown
    assert processes[0].exitcode == 1
    for rank in range(2):
        report = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert report["world_size"] == 2 and report["squares"] == [u * u for u in range(7)]
        assert report["calls"] == ([0, 2, 4, 6] if rank == 0 else [1, 3, 5])  # every 2nd unit
        assert "failing failed on 1 of 2 processes (rank 1: ZeroDivisionError" in report["failing"]
        assert report["broadcast"] == {"from": 0}
    killed = (tmp_path / "killed0.txt").read_text()
    assert "lost contact with another process" in killed and "rerun the same command" in killed
    # units 0, 2, 4, 6 (rank 0) and 1, 3 (rank 1, before it died) are on disk: one process finishes the rest
    calls = []
    out = Sharding(store=UnitStore(store, {"run": "killed"})).map(
        range(8), lambda u: calls.append(u) or torch.tensor([float(u)]), desc="killed", progress=False)
    assert calls == [5, 7]
    assert [float(t) for t in out] == [float(u) for u in range(8)]


def test_commands_that_do_not_shard_refuse_several_processes(monkeypatch):
    import argparse

    from vlens.parallel import command
    from vlens.utils.errors import UserInputError

    monkeypatch.setattr(command, "from_env", lambda: Sharding(rank=1, world_size=2, local_rank=1))
    with pytest.raises(UserInputError, match="vlens info does not split its work"):
        with command.sharded_command("vlens info", shardable=False):
            pass
    args = argparse.Namespace(model="tiny", seed=3, out="x", overwrite=True, quiet=True, func=print)
    assert command.run_settings(args) == {"model": "tiny", "seed": 3}


def test_overwrite_replaces_a_store_of_other_settings(tmp_path):
    from vlens.parallel.command import run_store

    run_store(tmp_path, {"seed": 0}).stage(0, "sweep", 2).save(0, torch.ones(1))
    with pytest.raises(ValueError, match="differ in seed"):
        run_store(tmp_path, {"seed": 1}).stage(0, "sweep", 2)
    stage = run_store(tmp_path, {"seed": 1}, overwrite=True).stage(0, "sweep", 2)
    assert stage.count() == 0


def test_one_torchrun_process_computes_with_one_thread_like_several(monkeypatch):
    from vlens.parallel import from_env

    before = torch.get_num_threads()
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    torch.set_num_threads(2)
    try:
        sharding = from_env()
        assert sharding.world_size == 1 and not sharding.distributed
        assert torch.get_num_threads() == 1  # what torchrun gives each of several processes
        torch.set_num_threads(2)
        monkeypatch.setenv("OMP_NUM_THREADS", "2")  # an explicit choice is kept
        from_env()
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)

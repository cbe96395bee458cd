"""torchrun: 2 gloo processes on the CPU write the results of 1 process (same numbers, same order).

The single-process runs go through `vlens.cli.main` in this process; the sharded ones through
`python -m torch.distributed.run --nproc-per-node 2 -m vlens ...` (a head sweep) and one launch
running ablate, eval, logit-lens and headlens one after the other (`tests.helpers.torchrun`); a
warning every rank meets is printed once (`vlens.parallel.quiet`).
"""

from __future__ import annotations

import json
import math

import pytest

from tests.helpers.torchrun import THEN, torchrun
from vlens.cli import main

WORLD_KEYS = {"world_size", "provenance"}  # provenance: times, the --out folder, the world size


def _strip_world(value):
    if isinstance(value, dict):
        return {k: _strip_world(v) for k, v in value.items() if k not in WORLD_KEYS}
    if isinstance(value, list):
        return [_strip_world(v) for v in value]
    return value


def assert_same(one, two, where="results"):
    """Equal structure and order; numbers within 1e-6."""
    if isinstance(one, dict):
        assert isinstance(two, dict) and list(one) == list(two), f"{where}: keys differ"
        for key in one:
            assert_same(one[key], two[key], f"{where}.{key}")
    elif isinstance(one, list):
        assert isinstance(two, list) and len(one) == len(two), f"{where}: lengths differ"
        for i, (a, b) in enumerate(zip(one, two, strict=True)):
            assert_same(a, b, f"{where}[{i}]")
    elif isinstance(one, float) and isinstance(two, float):
        assert (math.isnan(one) and math.isnan(two)) or abs(one - two) <= 1e-6, f"{where}: {one} != {two}"
    else:
        assert one == two, f"{where}: {one!r} != {two!r}"


def _results(folder):
    data = json.loads((folder / "results.json").read_text())
    return data


def _compare(one_folder, two_folder, files=("results.json",)):
    for name in files:
        one, two = json.loads((one_folder / name).read_text()), json.loads((two_folder / name).read_text())
        assert _find_world(two) == 2 and _find_world(one) == 1, f"{name} does not record the world size"
        assert two["provenance"]["world_size"] == 2 and one["provenance"]["world_size"] == 1
        assert_same(_strip_world(one), _strip_world(two), name)
    assert not list(two_folder.glob(".vlens-shards*")), "the resume folder is removed after a finished run"


def _find_world(value):
    if isinstance(value, dict):
        if "world_size" in value:
            return value["world_size"]
        for v in value.values():
            found = _find_world(v)
            if found is not None:
                return found
    return None


def _check(result):
    assert result.returncode == 0, f"torchrun failed:\n{result.stdout[-3000:]}\n{result.stderr[-6000:]}"


def test_head_sweep_on_two_processes_equals_one(tmp_path):
    args = ["patch", "--model", "tiny", "--make-pairs", "4", "--mode", "layer-head", "--max-batch", "8", "--quiet"]
    assert main([*args, "--out", str(tmp_path / "one")]) == 0
    _check(torchrun("vlens", [*args, "--out", str(tmp_path / "two")]))
    _compare(tmp_path / "one", tmp_path / "two")


def test_ablation_evaluation_and_lenses_on_two_processes_equal_one(tmp_path):
    data = tmp_path / "syndot"
    assert main(["data", "syndot", "--n", "5", "--seed", "3", "--out", str(data), "--quiet"]) == 0
    # a row without its image: eval --skip-missing warns about it on every rank; the warning shows once
    rows = (data / "metadata.jsonl").read_text().splitlines()
    missing = {**json.loads(rows[0]), "file_name": "missing.png"}
    (data / "metadata.jsonl").write_text("\n".join([*rows, json.dumps(missing)]) + "\n")
    commands = {
        "ablate": ["ablate", "--model", "tiny", "--tasks", "counting", "--n-examples", "5", "--n-reference", "4",
                   "--batch-size", "2", "--heads-per-pass", "3", "--top-k", "3"],
        "eval": ["eval", "--model", "tiny", "--data", str(data), "--format", "imagefolder", "--batch-size", "2",
                 "--max-new-tokens", "3", "--skip-missing"],
        "logit-lens": ["logit-lens", "--model", "tiny", "--make", "5", "--batch-size", "2"],
        # attribution patching splits its pair chunks (SweepOptions.batch_size) across the processes
        "atp": ["patch", "--model", "tiny", "--make-pairs", "5", "--mode", "atp", "--batch-size", "2"],
        "headlens": ["headlens", "--model", "tiny", "--make", "5", "--batch-size", "2", "--lens-make", "6",
                     "--lens-steps", "5"],
        "circuit": ["circuit", "--model", "tiny", "--make-pairs", "4", "--pair-batch-size", "2", "--ig-steps", "2",
                    "--target", "0.5", "--exact-check", "6", "--max-batch", "8"],
    }
    launch = []
    for name, args in commands.items():
        assert main([*args, "--quiet", "--out", str(tmp_path / f"{name}-1")]) == 0
        launch += [*args, "--quiet", "--out", str(tmp_path / f"{name}-2"), THEN]
    launched = torchrun("tests.helpers.torchrun", launch[:-1])
    _check(launched)
    assert launched.stderr.count("warning: skipped 1 rows") == 1, launched.stderr[-3000:]  # rank 0's only
    for name in commands:
        _compare(tmp_path / f"{name}-1", tmp_path / f"{name}-2")
    one = [json.loads(line) for line in (tmp_path / "eval-1" / "predictions.jsonl").read_text().splitlines()]
    two = [json.loads(line) for line in (tmp_path / "eval-2" / "predictions.jsonl").read_text().splitlines()]
    assert one == two and [p["id"] for p in one] == sorted(p["id"] for p in one)


@pytest.mark.slow
def test_a_killed_rank_fails_the_run_and_a_rerun_resumes(tmp_path):
    args = ["patch", "--model", "tiny", "--make-pairs", "4", "--mode", "layer-head", "--max-batch", "4", "--quiet"]
    assert main([*args, "--out", str(tmp_path / "one")]) == 0
    out = tmp_path / "two"
    result = torchrun("tests.helpers.kill_rank", [*args, "--out", str(out)], env={"VLENS_TEST_KILL_AFTER": "1"})
    assert result.returncode != 0
    assert "SIGKILL" in result.stderr and "rerun the same command" in result.stderr
    assert not (out / "results.json").exists()
    finished = list((out / ".vlens-shards").rglob("unit-*.pt"))
    assert finished, "the finished units are kept"
    assert main([*args, "--out", str(out)]) == 0  # one process resumes the two-process run
    assert _strip_world(_results(out)) == _strip_world(_results(tmp_path / "one"))

"""imagefolder I/O and the `vlens data` CLI, read back with and without `datasets`."""

import json

import numpy as np
import pytest

from vlens.cli import main
from vlens.data import make_pair, read_imagefolder, render_synpoly, write_imagefolder


def run_cli(*argv: str) -> int:
    return main(["data", *argv, "--quiet"])


def test_write_read_round_trip(tmp_path):
    samples = [render_synpoly(n, seed=n, size=64) for n in (1, 2, 3)]
    write_imagefolder(samples, tmp_path / "ds")
    records = read_imagefolder(tmp_path / "ds")
    assert [r["file_name"] for r in records] == ["000000.png", "000001.png", "000002.png"]
    for (img, rec), back in zip(samples, records, strict=True):
        assert {k: back[k] for k in rec} == rec
        assert np.array_equal(np.asarray(back.open_image()), np.asarray(img))
    with pytest.raises(FileExistsError):
        write_imagefolder(samples, tmp_path / "ds")
    with pytest.raises(ValueError, match="one schema"):
        write_imagefolder(samples[:1] + make_pair(1, 2, seed=0, size=64).samples(), tmp_path / "mixed")
    with pytest.raises(FileNotFoundError, match="metadata.jsonl"):
        read_imagefolder(tmp_path)


def test_cli_pairs_identical_for_any_worker_count_and_readable_by_datasets(tmp_path):
    import datasets  # the data extra (dev installs it)
    common = ["--n", "8", "--seed", "5", "--image-size", "64", "--counts", "1-6"]
    assert run_cli("pairs", *common, "--out", str(tmp_path / "w1"), "--workers", "1") == 0
    assert run_cli("pairs", *common, "--out", str(tmp_path / "w2"), "--workers", "2") == 0
    meta1 = (tmp_path / "w1" / "metadata.jsonl").read_text()
    assert meta1 == (tmp_path / "w2" / "metadata.jsonl").read_text()
    for line in meta1.splitlines():
        name = json.loads(line)["file_name"]
        assert (tmp_path / "w1" / name).read_bytes() == (tmp_path / "w2" / name).read_bytes()

    ds = datasets.load_dataset("imagefolder", data_dir=str(tmp_path / "w1"), split="train")
    assert len(ds) == 16
    for column in ("count", "question", "answer", "objects", "seed", "task", "pair_id", "role"):
        assert column in ds.column_names
    by_pair = {}
    for row in ds:
        by_pair.setdefault(row["pair_id"], {})[row["role"]] = row
    assert len(by_pair) == 8
    for roles in by_pair.values():
        clean, corrupt = roles["clean"], roles["corrupt"]
        assert abs(clean["count"] - corrupt["count"]) == len(clean["changed"]) >= 1
        assert clean["image"].size == corrupt["image"].size == (64, 64)


def test_cli_tasks_and_generators(tmp_path):
    assert run_cli("tasks", "--n", "12", "--out", str(tmp_path / "t"), "--image-size", "96") == 0
    records = read_imagefolder(tmp_path / "t")
    assert [r["task"] for r in records[:6]] == [
        "counting",
        "colour",
        "shape",
        "spatial",
        "arithmetic",
        "existence",
    ]
    assert (
        run_cli("synreal", "--n", "3", "--out", str(tmp_path / "r"), "--counts", "2-4", "--image-size", "96") == 0
    )
    assert [r["count"] for r in read_imagefolder(tmp_path / "r")] == [2, 3, 4]
    assert (
        run_cli("pairs", "--n", "3", "--out", str(tmp_path / "m"), "--kind", "move", "--style", "synpoly")
        == 0
    )
    assert {r["pair_kind"] for r in read_imagefolder(tmp_path / "m")} == {"move"}


def test_cli_reports_impossible_requests(tmp_path, capsys):
    assert (
        run_cli(
            "syndot",
            "--n",
            "2",
            "--out",
            str(tmp_path / "x"),
            "--image-size",
            "64",
            "--radius",
            "20",
            "--counts",
            "50",
        )
        == 2
    )
    assert "fewer objects" in capsys.readouterr().err
    assert run_cli("syndot", "--n", "2", "--out", str(tmp_path / "y"), "--counts", "0-2") == 2
    assert "--allow-empty" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        run_cli("syndot", "--n", "2", "--out", str(tmp_path / "z"), "--counts", "one-two")

"""Every flag value is checked before any model loads or --out is made, each in one line."""

from __future__ import annotations

import os

import pytest

from tests.helpers.faults import run_cli


@pytest.mark.parametrize(("argv", "needle"), [
    (["logit-lens", "--make", "2", "--out", ""], "argument --out: is empty"),
    (["data", "syndot", "--n", "2", "--out", " "], "argument --out: is empty"),
    (["train", "--data", ".", "--out", ""], "argument --out: is empty"),
    (["eval", "--data", "", "--out", "o"], "argument --data: is empty"),
    (["logit-lens", "--make", "2", "--image-size", "100000", "--out", "o"],
     "argument --image-size: must be an integer in [28, 4096]"),
    (["data", "syndot", "--n", "2", "--image-size", "30000", "--out", "o"], "argument --image-size"),
    (["info", "--max-pixels", "10000000000"], "argument --max-pixels"),
    (["info", "--device-map", "auto", "--max-memory", "0=lots"], "size 'lots' for device '0' is not a size"),
    (["info", "--device-map", "auto", "--max-memory", "0=0GiB"], "is not a size"),
    (["info", "--device-map", "auto", "--max-memory", "cpu=-5"], "is not a size"),
    (["ablate", "--tasks", "counting,nope", "--out", "o"], "unknown task 'nope'"),
    (["ablate", "--tasks", "counting@glossy", "--out", "o"], "unknown style 'glossy'"),
])
def test_bad_flag_values_fail_while_parsing(tmp_path, capsys, monkeypatch, argv, needle):
    monkeypatch.chdir(tmp_path)
    code, err = run_cli(argv, capsys)
    assert code == 2 and needle in err and "Traceback" not in err, err
    assert os.listdir(tmp_path) == []  # nothing written, not even --out


def test_flags_that_depend_on_each_other_fail_before_anything_runs(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for argv, needle in ((["logit-lens", "--make", "2", "--min-pixels", "9000", "--max-pixels", "5000", "--out", "o"],
                          "--min-pixels 9000 is larger than --max-pixels 5000"),
                         (["eval", "--data", ".", "--image-size", "56", "--max-pixels", "5000", "--out", "o"],
                          "give one of them"),
                         (["logit-lens", "--make", "2", "--model", "./nope", "--out", "o"], "no such folder")):
        code, err = run_cli(argv, capsys)
        lines = err.strip().splitlines()
        assert code == 2 and len(lines) == 1 and needle in lines[0], err
        assert not (tmp_path / "o").exists()


def test_max_memory_reads_sizes_as_accelerate_does():
    from vlens.cli.options import max_memory_arg

    assert max_memory_arg("0=70GiB,cpu=2.5GB,1=1000") == {0: "70GiB", "cpu": "2.5GB", 1: 1000}

"""Fault family "vlens data overwrites a user's files": the writer only writes into a new, empty or
own folder, --overwrite removes only what vlens data wrote, generation streams to disk, and --n /
--size are bounded."""

from __future__ import annotations

import json

import pytest

from vlens.cli import main
from vlens.data.generate import MAX_SAMPLES, DatasetSpec, generate_dataset
from vlens.data.imagefolder import MARKER_FILE, METADATA_FILE


def run(*argv: str) -> int:
    return main(["data", *argv, "--quiet"])


def test_users_files_are_never_overwritten_or_deleted(tmp_path, capsys):
    user = tmp_path / "photos"
    user.mkdir()
    (user / "000000.png").write_bytes(b"my photo")
    (user / "notes.txt").write_text("mine")
    for extra in ((), ("--overwrite",)):
        assert run("syndot", "--n", "2", "--image-size", "56", "--out", str(user), *extra) == 2
        assert "not written by vlens data" in capsys.readouterr().err
    assert (user / "000000.png").read_bytes() == b"my photo" and sorted(p.name for p in user.iterdir()) == [
        "000000.png", "notes.txt"]


def test_overwrite_removes_only_its_own_files(tmp_path, capsys):
    out = tmp_path / "ds"
    assert run("syndot", "--n", "3", "--image-size", "56", "--out", str(out)) == 0
    assert json.loads((out / MARKER_FILE).read_text())["n"] == 3
    assert run("syndot", "--n", "3", "--image-size", "56", "--out", str(out)) == 2
    assert "--overwrite" in capsys.readouterr().err
    (out / "README.txt").write_text("the user's note about this dataset")
    assert run("syndot", "--n", "1", "--image-size", "56", "--out", str(out), "--overwrite") == 0
    assert sorted(p.name for p in out.iterdir()) == [MARKER_FILE, "000000.png", "README.txt", METADATA_FILE]
    assert len((out / METADATA_FILE).read_text().splitlines()) == 1


def test_generation_streams_and_an_interrupted_run_is_not_a_dataset(tmp_path, monkeypatch):
    import vlens.data.generate as generate

    calls = []
    real = generate._write_sample

    def fail_at_third(job):
        calls.append(job[1])
        if job[1] == 2:
            raise KeyboardInterrupt
        return real(job)

    monkeypatch.setattr(generate, "_write_sample", fail_at_third)
    with pytest.raises(KeyboardInterrupt):
        generate_dataset(DatasetSpec("syndot", MAX_SAMPLES, 0, size=56), tmp_path / "big")
    assert calls == [0, 1, 2]  # samples are rendered one at a time, not all up front
    written = (tmp_path / "big" / "metadata.jsonl.partial").read_text().splitlines()
    assert len(written) == 2 and not (tmp_path / "big" / METADATA_FILE).exists()


@pytest.mark.parametrize("argv", [["--n", "0"], ["--n", "-5"], ["--n", str(MAX_SAMPLES + 1)], ["--n", "2", "--image-size", "0"],
                                  ["--n", "2", "--workers", "0"], ["--n", "2", "--radius", "-3"]])
def test_bad_sizes_are_refused_while_parsing(tmp_path, argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        run("syndot", *argv, "--out", str(tmp_path / "x"))
    assert exit_info.value.code == 2 and "argument --" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()

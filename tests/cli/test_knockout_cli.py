"""`vlens knockout`: runs on the embedded model and writes a result that loads back; its spelled-out
choices are the library's; edges that need object boxes are refused on data without them."""

from __future__ import annotations

import json

import pytest

import vlens
from vlens.cli import main
from vlens.cli.knockout import OBJECT_TASK_NAMES, REGIONS
from vlens.flow.batch import TASK_NAMES
from vlens.flow.sweep import ENDPOINTS, KnockoutSweep


def test_choices_are_the_librarys():
    assert OBJECT_TASK_NAMES == TASK_NAMES
    assert set(REGIONS) == set(ENDPOINTS)


def test_knockout_command_writes_a_result_that_loads_back(tmp_path, capsys):
    out = tmp_path / "ko"
    code = main(["knockout", "--task", "colour", "--n", "3", "--from", "image", "--to", "final", "--edge",
                 "object->final", "--window", "4", "--out", str(out), "--quiet"])
    assert code == 0
    result = vlens.load_result(out)
    assert isinstance(result, KnockoutSweep)
    assert list(result.summary) == ["image->final", "object->final"]
    assert result.windows == [[0, 1, 2], [0, 1, 2, 3], [1, 2, 3], [2, 3]]
    assert result.settings["model_arg"] == "tiny"
    assert "image->final" in capsys.readouterr().out
    assert json.loads((out / "results.json").read_text())["kind"] == "knockout_sweep"


def test_bad_edge_is_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["knockout", "--from", "picture", "--out", str(tmp_path / "x")])
    assert exit_info.value.code == 2
    with pytest.raises(SystemExit) as exit_info:  # refused while parsing
        main(["knockout", "--edge", "image=>final", "--out", str(tmp_path / "y"), "--quiet"])
    assert exit_info.value.code == 2 and "SRC->DST" in capsys.readouterr().err


def test_knockout_reads_a_vlens_imagefolder_with_object_boxes(tmp_path):
    data = tmp_path / "colour"
    assert main(["data", "tasks", "--tasks", "colour", "--n", "3", "--image-size", "64", "--out", str(data),
                 "--quiet"]) == 0
    out = tmp_path / "ko"
    assert main(["knockout", "--data", str(data), "--edge", "object->final", "--window", "4", "--out", str(out),
                 "--quiet"]) == 0
    result = vlens.load_result(out)
    assert result.n == 3 and list(result.summary) == ["object->final"]

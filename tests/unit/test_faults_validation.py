"""Fault family "bad values": the shared checks refuse out-of-range, non-integer and non-finite
values with one line naming the argument and the allowed range."""

from __future__ import annotations

import argparse
import math

import pytest

from vlens.utils.errors import UserInputError
from vlens.utils.validation import (
    arg_float,
    arg_int,
    check_count,
    check_float,
    check_int,
    check_output_file,
    check_output_folder,
    check_top_k,
)


@pytest.mark.parametrize("value", [-2, 0, 1.5, "3", True, float("nan"), None])
def test_check_count_refuses_bad_values(value):
    with pytest.raises(UserInputError, match=r"^limit must be an integer >= 1, got "):
        check_count(value, "limit")


def test_check_count_accepts_and_normalises():
    assert check_count(3, "limit") == 3
    assert check_count(4.0, "limit") == 4
    assert check_count(None, "limit", allow_none=True) is None
    assert check_int(0, "steps", min=0) == 0
    with pytest.raises(UserInputError, match=r"in \[1, 8\]"):
        check_int(9, "k", min=1, max=8)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -math.inf, "1.0", None])
def test_check_float_refuses_non_finite(value):
    with pytest.raises(UserInputError, match=r"^focus_weight must be a finite number >= 0"):
        check_float(value, "focus_weight", min=0)


def test_check_float_open_bounds():
    assert check_float(0.5, "lr", min=0, min_open=True) == 0.5
    with pytest.raises(UserInputError, match=r"> 0"):
        check_float(0.0, "lr", min=0, min_open=True)


def test_check_top_k_refuses_k_covering_every_head():
    assert check_top_k(31, "--top-k", 32) == 31
    with pytest.raises(UserInputError, match=r"--top-k must be an integer in \[1, 31\].*32 heads"):
        check_top_k(32, "--top-k", 32)
    with pytest.raises(UserInputError, match=r"--top-k"):
        check_top_k(100, "--top-k", 32)
    with pytest.raises(UserInputError):
        check_top_k(0, "--top-k", 32)


def test_argparse_adapters_name_the_flag_and_exit_2(capsys):
    parser = argparse.ArgumentParser(prog="vlens x")
    parser.add_argument("--limit", type=arg_int(min=1))
    parser.add_argument("--weight", type=arg_float(min=0))
    assert parser.parse_args(["--limit", "3", "--weight", "0.5"]).limit == 3
    for argv, flag in ((["--limit", "-2"], "--limit"), (["--limit", "x"], "--limit"),
                       (["--weight", "nan"], "--weight"), (["--weight", "inf"], "--weight")):
        with pytest.raises(SystemExit) as exit_info:
            parser.parse_args(argv)
        assert exit_info.value.code == 2
        err = capsys.readouterr().err.strip().splitlines()[-1]
        assert f"argument {flag}: must be" in err and argv[1] in err


def test_output_paths(tmp_path):
    (tmp_path / "file.txt").write_text("x")
    with pytest.raises(UserInputError, match="is a folder"):
        check_output_file(tmp_path, "--out")
    with pytest.raises(UserInputError, match="is a file"):
        check_output_folder(tmp_path / "file.txt", "--out")
    with pytest.raises(UserInputError, match="is a file"):
        check_output_file(tmp_path / "file.txt" / "res.json", "--out")
    assert check_output_file(tmp_path / "file.txt", "--out") == tmp_path / "file.txt"  # an earlier result: replaced
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    with pytest.raises(UserInputError, match="already holds a model; pass --overwrite"):
        check_output_folder(model, "--out")
    assert check_output_folder(model, "--out", overwrite=True, model_folder=True) == model
    user = tmp_path / "user"
    user.mkdir()
    (user / "notes.txt").write_text("mine")
    with pytest.raises(UserInputError, match="not a model folder"):
        check_output_folder(user, "--out", overwrite=True, model_folder=True)
    assert check_output_folder(tmp_path / "new" / "deeper", "--out", model_folder=True)

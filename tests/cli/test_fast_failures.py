"""A missing input path fails before torch (or a parser) is imported, in one line, exit 2."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.faults import run_cli
from vlens.cli import COMMANDS, build_parser
from vlens.cli.early_checks import INPUT_FLAGS, missing_input

ROOT = Path(__file__).resolve().parents[2]


def _leaves(parser: argparse.ArgumentParser):
    groups = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not groups:
        yield parser
        return
    for group in groups:
        for child in {id(p): p for p in group.choices.values()}.values():
            yield from _leaves(child)


def _marked(parser: argparse.ArgumentParser) -> dict[str, bool]:
    """flag -> takes several values, for every input path a parser marks (mark_input_paths)."""
    flags = {}
    for leaf in _leaves(parser):
        dests = leaf.get_default("input_paths") or ()
        for action in leaf._actions:
            if action.dest in dests:
                long = next(o for o in action.option_strings if o.startswith("--"))
                flags[long] = action.nargs == "+"
    return flags


def test_the_early_table_is_what_the_parsers_mark():
    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    derived = {c.name: _marked(commands.choices[c.name]) for c in COMMANDS}
    assert {name: flags for name, flags in derived.items() if flags} == INPUT_FLAGS


@pytest.mark.parametrize(("argv", "prog", "flag"), [
    (["patch", "--pairs", "nope", "--mode", "layer-head", "--out", "o"], "vlens patch", "--pairs nope"),
    (["-q", "logit-lens", "--data=nope", "--out", "o"], "vlens logit-lens", "--data nope"),
    (["ablate", "--data", ".", "nope", "--out", "o"], "vlens ablate", "--data nope"),
    (["temperature", "apply", "--temps", "nope", "--data", ".", "--out", "o"], "vlens temperature apply",
     "--temps nope"),
    (["eval", "--data", ".", "--image-dir", "nope", "--out", "o"], "vlens eval", "--image-dir nope"),
])
def test_a_missing_input_is_one_line_before_anything_loads(tmp_path, capsys, monkeypatch, argv, prog, flag):
    monkeypatch.chdir(tmp_path)
    assert missing_input(argv)[0] == prog
    code, err = run_cli(argv, capsys)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith(f"{prog}: error: {flag}: no such file"), err
    assert not (tmp_path / "o").exists()


def test_existing_inputs_help_and_values_after_double_dash_pass_the_early_check(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert missing_input(["eval", "--data", ".", "--out", "o"]) is None
    assert missing_input(["eval", "--data", "nope", "--help"]) is None
    assert missing_input(["data", "syndot", "--data", "nope"]) is None  # not an input flag there
    assert missing_input(["eval", "--", "--data", "nope"]) is None


def test_the_full_check_after_parsing_says_the_same(tmp_path, capsys, monkeypatch):
    from vlens.cli.options import check_args

    monkeypatch.chdir(tmp_path)
    argv = ["logit-lens", "--data", "nope", "--out", "o"]
    args = build_parser(argv).parse_args(argv)
    with pytest.raises(ValueError, match=r"--data nope: no such file or folder"):
        check_args(args)


def test_a_missing_path_imports_no_torch():
    code = ("import sys; from vlens.cli import main; "
            "status = main(['logit-lens', '--data', 'nope', '--out', 'o']); "
            "heavy = [m for m in ('torch', 'transformers', 'numpy', 'PIL', 'logging') if m in sys.modules]; "
            "print(status, heavy)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert done.stdout.strip() == "2 []", done.stdout + done.stderr

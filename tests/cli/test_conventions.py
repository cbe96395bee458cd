"""The `vlens` command line's conventions, checked over every command: fast help (nothing heavy
imported to build a parser), --version, one flag name per meaning, --out always a folder,
--quiet and -v everywhere, one-line user errors with exit 2, and --quiet hiding every bar."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from vlens.cli import COMMANDS, build_parser, main

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "numpy", "transformers", "PIL", "plotly")
MODEL_FLAGS = {"--model", "--device", "--dtype", "--image-size", "--min-pixels", "--max-pixels"}
# the recipe's `zoo evaluate --model` is a model folder (default: the shipped one), not a model spec
RECIPE_COMMANDS = {"vlens zoo train", "vlens zoo evaluate"}


def leaves(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    groups = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not groups:
        return [parser]
    children = {id(p): p for group in groups for p in group.choices.values()}
    return [leaf for child in children.values() for leaf in leaves(child)]


def options(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {flag: action for action in parser._actions for flag in action.option_strings}


ALL_LEAVES = leaves(build_parser())


def run_python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)


def test_every_help_builds_without_heavy_imports():
    """Each `vlens ... --help` path: the dispatcher builds only that command, importing nothing heavy."""
    code = f"""
import contextlib, io, sys
from vlens.cli import COMMANDS, build_parser, main
paths = [[]] + [[c.name] for c in COMMANDS] + [["data", "syndot"], ["lens", "train"], ["temperature", "fit"],
                                                ["zoo", "train"]]
for path in paths:
    with contextlib.redirect_stdout(io.StringIO()) as out:
        try:
            main([*path, "--help"])
        except SystemExit as exit:
            assert exit.code == 0, (path, exit.code)
    assert "usage: vlens" in out.getvalue(), path
parser = build_parser()  # every command at once
heavy = [m for m in {HEAVY!r} if m in sys.modules]
assert not heavy, heavy
print("ok", len(paths))
"""
    result = run_python(code)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.startswith("ok")


def test_version_and_python_m_vlens():
    from vlens import __version__

    result = subprocess.run([sys.executable, "-m", "vlens", "--version"], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0 and result.stdout.strip() == f"vlens {__version__}"


def test_bare_vlens_prints_help_and_fails(capsys):
    assert main([]) == 2
    assert "COMMAND" in capsys.readouterr().err


def test_table_lists_every_command_once():
    names = [c.name for c in COMMANDS]
    assert len(names) == len(set(names))
    top = build_parser()
    listed = next(a for a in top._actions if isinstance(a, argparse._SubParsersAction)).choices
    assert list(listed) == names


@pytest.mark.parametrize("leaf", ALL_LEAVES, ids=lambda p: p.prog)
def test_flag_conventions(leaf):
    flags = options(leaf)
    for old in ("--size", "--no-progress", "--html", "--markdown"):
        assert old not in flags, f"{leaf.prog}: {old} (renamed)"
    assert {"--quiet", "-q", "--verbose", "-v", "--help"} <= set(flags), leaf.prog
    if "--out" in flags:
        out = flags["--out"]
        assert out.metavar == "DIR" and out.help.startswith("output folder, created when missing"), leaf.prog
    if "--model" in flags and leaf.prog not in RECIPE_COMMANDS:
        assert MODEL_FLAGS <= set(flags), leaf.prog
        assert flags["--model"].default in ("tiny", None), leaf.prog
        assert flags["--device"].default == "auto"
    if "--batch-size" in flags:
        assert flags["--batch-size"].metavar == "N"
    text = leaf.format_help()
    for outside in ("PAPER.md", "DESIGN.md"):
        assert outside not in text, f"{leaf.prog} cites {outside}"


# the team's notes and coordination files live outside the repository: nothing shipped may cite them
OUTSIDE_FILES = ("PAPER.md", "DESIGN.md", "BOARD.md", "PROTOCOL.md", "/work/shared", "/work/coord")
TEXT_SUFFIXES = {".md", ".py", ".ipynb", ".json", ".jsonl", ".toml", ".txt", ".cfg", ".yaml", ".yml", ".html"}


def tracked_text_files() -> list[Path]:
    """The repository's tracked text files (every file below the root when git is not available)."""
    try:
        names = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True,
                               timeout=60).stdout.decode().split("\0")
        files = [ROOT / name for name in names if name]
    except (OSError, subprocess.CalledProcessError):
        files = [p for p in ROOT.rglob("*") if ".git" not in p.parts and ".venv" not in p.parts]
    return [p for p in files if p.suffix in TEXT_SUFFIXES or p.parent.name == ".ci"]


def test_no_tracked_file_cites_a_file_outside_the_repository():
    files = [p for p in tracked_text_files() if p.resolve() != Path(__file__).resolve() and p.is_file()]
    assert any(p.name == "MODEL_CARD.md" for p in files) and any(p.suffix == ".ipynb" for p in files)
    citing = [f"{p.relative_to(ROOT)}: {outside}" for p in files
              for outside in OUTSIDE_FILES if outside in p.read_text(encoding="utf-8", errors="replace")]
    assert not citing, "files citing notes outside the repository (say it in docs/ instead):\n" + "\n".join(citing)


def test_model_default_is_the_embedded_model_everywhere():
    for leaf in ALL_LEAVES:
        flags = options(leaf)
        if "--model" in flags and leaf.prog not in RECIPE_COMMANDS:
            model = flags["--model"]
            # or the model the input folder records (an SAE / transcoders: vlens.cli.recorded_model)
            recorded = model.default is None and "default: the model the" in (model.help or "")
            assert model.default == "tiny" or model.required or recorded, leaf.prog


def test_spelled_out_choices_match_the_library():
    from vlens.ablation import REFERENCE_MODES
    from vlens.ablation.hooks import METHODS
    from vlens.ablation.reference import ALIGNMENTS
    from vlens.ablation.results import RANK_BY
    from vlens.cli import ablate, data, options
    from vlens.cli import eval as eval_cli
    from vlens.core.devices import DTYPE_NAMES
    from vlens.data.backgrounds import POLY_BACKGROUNDS, REAL_BACKGROUNDS
    from vlens.data.generate import MAX_SAMPLES
    from vlens.data.pairs import PAIR_KINDS
    from vlens.data.styles import STYLES
    from vlens.data.templates import TASKS
    from vlens.evaluation.formats import FORMATS
    from vlens.evaluation.parsing import ANSWER_PARSERS
    from vlens.studies.ablation import DEFAULT_TASKS

    assert (data.TASKS, data.PAIR_KINDS) == (TASKS, PAIR_KINDS)
    assert set(data.STYLES) == set(STYLES)
    assert (data.POLY_BACKGROUNDS, data.REAL_BACKGROUNDS) == (POLY_BACKGROUNDS, REAL_BACKGROUNDS)
    assert set(eval_cli.FORMATS) == set(FORMATS) and set(eval_cli.ANSWER_PARSERS) == set(ANSWER_PARSERS)
    assert (ablate.METHODS, ablate.ALIGNMENTS, ablate.RANK_BY) == (METHODS, ALIGNMENTS, RANK_BY)
    assert (ablate.DEFAULT_TASKS, ablate.REFERENCE_MODES) == (DEFAULT_TASKS, REFERENCE_MODES)
    assert set(options.DTYPE_CHOICES) - {"auto"} <= set(DTYPE_NAMES)
    assert data.MAX_SAMPLES == MAX_SAMPLES


def test_old_flag_names_point_to_the_new_ones(capsys, tmp_path):
    with pytest.raises(SystemExit) as exit_info:
        main(["data", "syndot", "--n", "2", "--out", str(tmp_path), "--size", "64"])
    assert exit_info.value.code == 2
    assert "--size is now --image-size" in capsys.readouterr().err


def _one_line_error(capsys, argv: list[str], expected: str) -> None:
    assert main(argv) == 2, argv
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in captured.err, captured.err
    assert lines[0].startswith(f"vlens {argv[0]}") and ": error: " in lines[0], lines[0]
    assert expected in lines[0], lines[0]


def test_user_errors_are_one_line_and_exit_2(tmp_path, capsys):
    (tmp_path / "file.txt").write_text("not a model")
    _one_line_error(capsys, ["info", "--model", str(tmp_path / "missing")], "no such folder")
    _one_line_error(capsys, ["info", "--model", "./runs/ckpt"], "no such folder")
    _one_line_error(capsys, ["info", "--model", str(tmp_path / "file.txt")], "is a file")
    _one_line_error(capsys, ["info", "--model", str(tmp_path)], "holds no config.json")
    _one_line_error(capsys, ["info", "--model", "tyni"], "nor a hub id")
    _one_line_error(capsys, ["info", "--model", "random-tiny", "--image-size", "100"], "not a multiple of 28")
    _one_line_error(capsys, ["info", "--model", "random-tiny", "--min-pixels", "9000", "--max-pixels", "5000"],
                    "larger than --max-pixels")
    _one_line_error(capsys, ["data", "syndot", "--n", "2", "--out", str(tmp_path / "d"), "--image-size", "64",
                             "--radius", "20", "--counts", "50", "--quiet"], "fewer objects")
    _one_line_error(capsys, ["eval", "--model", "random-tiny", "--data", str(tmp_path / "nope"),
                             "--format", "imagefolder", "--out", str(tmp_path / "e")], "nope")
    _one_line_error(capsys, ["patch", "--model", "random-tiny", "--pairs", str(tmp_path / "nope"),
                             "--mode", "layer-head", "--out", str(tmp_path / "p")], "nope")
    _one_line_error(capsys, ["temperature", "fit", "--result", str(tmp_path / "nope.json"),
                             "--out", str(tmp_path / "t")], "nope.json")
    _one_line_error(capsys, ["patch", "--make-pairs", "2", "--mode", "atp", "--out", str(tmp_path / "file.txt")],
                    "is a file")


@pytest.mark.skipif("torch" in sys.modules and __import__("torch").cuda.is_available(), reason="a GPU is here")
def test_asking_for_a_missing_gpu_is_a_user_error(capsys):
    _one_line_error(capsys, ["info", "--model", "random-tiny", "--device", "cuda"], "no CUDA device")


def test_argument_errors_exit_2(capsys, tmp_path):
    for argv in (["data", "syndot", "--n", "0", "--out", str(tmp_path)],
                 ["info", "--dtype", "float8"],
                 ["patch", "--make-pairs", "2", "--mode", "sideways", "--out", str(tmp_path)]):
        with pytest.raises(SystemExit) as exit_info:
            main(argv)
        assert exit_info.value.code == 2, argv
        assert "error:" in capsys.readouterr().err


def test_results_are_not_replaced_without_overwrite(tmp_path, capsys):
    argv = ["temperature", "fit", "--result", str(tmp_path / "ablation.json"), "--top-k", "1",
            "--out", str(tmp_path / "temps"), "--quiet"]
    (tmp_path / "ablation.json").write_text(json.dumps({
        "task": "counting", "method": "mean", "alignment": "all", "n_examples": 1, "clean_logprob": 0.0,
        "clean_accuracy": 1.0, "ablated_logprob": [[-1.0, 0.0]], "ablated_accuracy": [[1.0, 1.0]]}))
    assert main(argv) == 0
    _one_line_error(capsys, argv, "already holds results.json; pass --overwrite")
    assert main([*argv, "--overwrite"]) == 0


def test_quiet_hides_every_bar_and_status_line(tmp_path, capsys):
    """--quiet: nothing on stderr (no tqdm bar, not even transformers' 'Loading weights'), results on stdout."""
    data = tmp_path / "data"
    assert main(["data", "syndot", "--n", "3", "--image-size", "56", "--out", str(data), "--quiet"]) == 0
    assert capsys.readouterr().err == ""
    assert main(["logit-lens", "--model", "random-tiny", "--data", str(data), "--out", str(tmp_path / "ll"),
                 "--quiet"]) == 0
    captured = capsys.readouterr()
    assert captured.err == "" and "layer 0: p(answer)=" in captured.out
    # without --quiet the same commands report progress on stderr
    assert main(["data", "syndot", "--n", "3", "--image-size", "56", "--out", str(data), "--overwrite"]) == 0
    assert "wrote 3 images" in capsys.readouterr().err


def test_quiet_hides_the_weight_loading_bar_of_a_saved_model(tmp_path, capsys):
    from vlens.testing import tiny_hf_model, tiny_qwen_processor

    tiny_hf_model().save_pretrained(tmp_path / "model")
    tiny_qwen_processor().save_pretrained(str(tmp_path / "model"))
    capsys.readouterr()
    assert main(["info", "--model", str(tmp_path / "model"), "--quiet"]) == 0
    captured = capsys.readouterr()
    assert captured.err == "" and "hook points" in captured.out


def test_verbose_logs_debug_lines(capsys):
    assert main(["info", "--model", "random-tiny", "-v"]) == 0
    assert "debug [vlens.zoo.specs]: loaded random-tiny" in capsys.readouterr().err


def test_verbose_adds_the_traceback_of_a_user_error_and_flags_work_before_the_command(capsys):
    assert main(["-v", "info", "--model", "./no/such/model"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" in err and err.strip().splitlines()[-1].startswith("vlens info: error: model './no/such/model'")
    assert main(["--quiet", "info", "--model", "random-tiny"]) == 0
    assert capsys.readouterr().err == ""



@pytest.mark.parametrize(("argv", "points_to_help"), [
    (["patch", "--make-pairs", "2", "--out", "x"], True),  # --mode missing: which flags exist
    (["nosuch"], True),
    (["eval", "--no-such-flag"], True),
    (["zoo", "train", "--steps", "0", "--out", "x"], False),  # a bad value: the message says what was wrong
])
def test_a_usage_error_is_one_line_without_the_usage_block(argv, points_to_help, capsys):
    from vlens.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and len(err.strip().splitlines()) == 1 and "usage:" not in err, err
    assert err.startswith("vlens") and ": error: " in err
    assert ("--help` lists the options" in err) == points_to_help, err

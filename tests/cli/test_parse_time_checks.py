"""Every value the parser can check is checked while the command line is read: a bad --style, --task,
--image-size, ... is argparse's one-line error naming the allowed values, before any model loads or --out
folder exists (before: `--style glossy` loaded the model, created --out and failed inside the generator).
The walk covers every command: a flag without a type or choices must be listed here with the reason it
cannot be checked while parsing."""

from __future__ import annotations

import argparse

import pytest

from tests.cli.test_conventions import ALL_LEAVES, options
from vlens.cli import build_parser

# flag -> (a bad value, text the error must show: the allowed values or form)
BAD_VALUES = {
    "--style": ("glossy", "use one of syndot, synpoly, synreal"),
    "--examples-style": ("glossy", "use one of syndot, synpoly, synreal"),
    "--task": ("juggling", "use one of counting, colour"),
    "--examples-task": ("juggling", "use one of counting, colour"),
    "--tasks": ("counting,juggling", "juggling"),
    "--positions": ("image,pixels", "image"),
    "--cells": ("a,b", "row,col"),
    "--features": ("3,x", "comma-separated feature indices"),
    "--layers": ("1,x", "layer"),
    "--image-nodes": ("hexagons", "ROWSxCOLS"),
    "--edge": ("image->nowhere", "SRC->DST"),
    "--at": ("nowhere", "vision, middle or a decoder layer number"),
    "--focus-layers": ("1,x", "comma-separated layer numbers"),
    "--heads": ("L3", "L<layer>H<head>"),
    "--image-size": ("0", "must be an integer in [28, 4096]"),
}
# flags whose value depends on what a command reads (a model, a dataset, a result file) or is free text
NOT_AT_PARSE_TIME = {
    "--model": "a spec, checked whole (folder, hub) by check_args before the command starts",
    "--device": "resolved by check_args before the command starts",
    "--hook": "a hook point of the loaded model",
    "--split": "a split of the dataset read",
    "--prompt": "free text", "--target": "a token of the model's vocabulary", "--contrast": "as --target",
    "--positive": "free text", "--negative": "free text", "--continuation": "free text",
    "--post-prompt": "free text", "--image-column": "a column of the dataset read",
    "--category-field": "a field of the dataset read (checked against it before the model loads)",
    "--checkpoint-dir": "a folder (created or resumed)", "--init-from": "a model folder", "--vision-from": "a model folder",
    "--interventions": "a file", "--lens": "a folder", "--thresholds": "a file", "--vocab": "a file",
    "--mix": "the recipe's stage mix",
    "--metric": "patch: checked before the model loads (its names depend on --mode); temperature fit: the "
                "result's grids",
    "--patching-metric": "a grid of the --patching file", "--classes": "classes of the taxonomy read",
    "--background": "depends on --style (the generator refuses it before rendering)",
    "--family": "vlens tiny: a family of vlens.testing, checked before anything is written",
}


def _words(leaf: argparse.ArgumentParser) -> list[str]:
    return leaf.prog.split()[1:]


def test_every_untyped_flag_is_accounted_for():
    for leaf in ALL_LEAVES:
        for flag, action in options(leaf).items():
            if not flag.startswith("--") or action.nargs == 0 or action.type is not None or action.choices:
                continue
            if flag == "--task" and leaf.prog == "vlens temperature fit":
                continue  # a task of the ablation report it reads
            assert flag in NOT_AT_PARSE_TIME, f"{leaf.prog} {flag}: give it a type (checked while parsing) or say why not"


@pytest.mark.parametrize("flag", sorted(BAD_VALUES))
def test_a_bad_value_is_refused_while_parsing(flag, capsys):
    bad, expected = BAD_VALUES[flag]
    users = [leaf for leaf in ALL_LEAVES if flag in options(leaf) and options(leaf)[flag].type is not None]
    assert users, flag
    parser = build_parser()
    for leaf in users:
        with pytest.raises(SystemExit) as exit_:
            parser.parse_args([*_words(leaf), flag, bad])  # required flags missing: the bad value is read first
        err = capsys.readouterr().err.strip().splitlines()[-1]
        assert exit_.value.code == 2 and f"argument {flag}:" in err and expected in err, (leaf.prog, err)


def test_the_defaults_and_good_values_parse():
    parser = build_parser()
    args = parser.parse_args(["sae", "evaluate", "--sae", "s", "--make", "2", "--task", "colour", "--style", "synpoly",
                              "--positions", "image,all", "--out", "o"])
    assert (args.task, args.style, args.positions, args.model) == ("colour", "synpoly", "image,all", None)
    args = parser.parse_args(["circuit", "--make-pairs", "2", "--image-nodes", "3x3", "--out", "o"])
    assert args.image_nodes == "3x3"
    args = parser.parse_args(["knockout", "--edge", "object->final", "--edge", "image->final", "--out", "o"])
    assert args.edge == ["object->final", "image->final"]

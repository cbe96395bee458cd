"""Every `vlens ... --help` option is described: non-empty help, its choices listed, its default shown
(where it has one worth showing), over every command's and sub-command's parser."""

from __future__ import annotations

import argparse

import pytest

from vlens.cli import build_parser, main
from vlens.cli.help_text import all_parsers, shows_default

SKIPPED = (argparse._HelpAction, argparse._VersionAction, argparse._SubParsersAction)


def described_options() -> list[tuple[str, argparse.Action, str]]:
    """(command, action, the help text as --help prints it) of every option of every parser."""
    out = []
    for parser in all_parsers(build_parser()):
        formatter = parser._get_formatter()
        for action in parser._actions:
            if isinstance(action, SKIPPED) or action.help == argparse.SUPPRESS:
                continue
            text = formatter._expand_help(action) if action.help else ""
            out.append((parser.prog, action, text))
    return out


OPTIONS = described_options()


def test_the_walk_reaches_every_command_and_sub_command():
    progs = {prog for prog, _, _ in OPTIONS}
    assert {"vlens patch", "vlens sae train", "vlens temperature fit", "vlens zoo evaluate",
            "vlens data pairs"} <= progs
    assert len(OPTIONS) > 500


def test_every_option_has_help():
    missing = [f"{prog} {'/'.join(action.option_strings) or action.dest}" for prog, action, text in OPTIONS
               if not text.strip()]
    assert not missing, missing


def test_every_option_with_choices_lists_them():
    unlisted = [f"{prog} {'/'.join(action.option_strings) or action.dest}: {choice}"
                for prog, action, text in OPTIONS if action.choices is not None
                for choice in map(str, action.choices) if choice not in text]
    assert not unlisted, unlisted


def test_every_default_worth_showing_is_shown():
    hidden = [f"{prog} {'/'.join(action.option_strings)}" for prog, action, text in OPTIONS
              if shows_default(action) and "default" not in text.lower()]
    assert not hidden, hidden


@pytest.mark.parametrize("default, action, shown", [(None, "store", False), (False, "store_true", False),
                                                    (3, "store", True), ("", "store", False)])
def test_which_defaults_are_worth_showing(default, action, shown):
    parser = argparse.ArgumentParser()
    added = parser.add_argument("--x", default=default, action=action)
    assert shows_default(added) is shown


def test_the_printed_help_carries_choices_and_defaults(capsys):
    with pytest.raises(SystemExit):
        main(["data", "pairs", "--help"])
    printed = " ".join(capsys.readouterr().out.split())
    assert "(choices: count, move, colour; default: count)" in printed
    assert "default: syndot" in printed

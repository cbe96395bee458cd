"""`--help` that says what each option takes: its choices and its default, added where the help text
does not already say them (every parser of the `vlens` command line uses these formatters)."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

# actions whose default is no setting worth printing (a flag's False, a counter's 0)
_FLAG_ACTIONS = (argparse._StoreTrueAction, argparse._StoreFalseAction, argparse._CountAction,
                 argparse._StoreConstAction, argparse._AppendConstAction, argparse._HelpAction,
                 argparse._VersionAction, argparse._SubParsersAction)


def shows_default(action: argparse.Action) -> bool:
    """Whether `action`'s default is a value worth showing in --help."""
    default = action.default
    return not isinstance(action, _FLAG_ACTIONS) and default not in (None, argparse.SUPPRESS, "", [], ()) \
        and default is not False


def help_additions(action: argparse.Action) -> str:
    """What `action`'s help gains: the choices it does not name yet, the default it does not state."""
    text = action.help or ""
    extra = []
    if action.choices is not None and not isinstance(action, argparse._SubParsersAction):
        choices = [str(choice) for choice in action.choices]
        if not all(choice in text for choice in choices):
            extra.append("choices: " + ", ".join(choices))
    if shows_default(action) and "default" not in text.lower() and "%(default)" not in text:
        extra.append("default: %(default)s")
    return f" ({'; '.join(extra)})" if extra else ""


class OptionsHelpFormatter(argparse.HelpFormatter):
    """argparse's formatter, each option's help followed by its choices and default where it lacks them."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.help in (None, argparse.SUPPRESS):
            return action.help
        return action.help + help_additions(action)


class RawDescriptionOptionsHelpFormatter(OptionsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """The same, keeping the description and epilog as written (the top-level parser's command table)."""


def all_parsers(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    """`parser` and every parser under it (sub-commands at any depth; an alias's parser once)."""
    seen: set[int] = set()
    stack = [parser]
    while stack:
        current = stack.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        for action in current._actions:
            if isinstance(action, argparse._SubParsersAction):
                stack.extend(action.choices.values())


def use_options_help(parser: argparse.ArgumentParser) -> None:
    """Give `parser` and every parser under it the formatter above (keeping a raw description raw)."""
    for each in all_parsers(parser):
        raw = isinstance(each.formatter_class, type) and issubclass(each.formatter_class,
                                                                  argparse.RawDescriptionHelpFormatter)
        each.formatter_class = RawDescriptionOptionsHelpFormatter if raw else OptionsHelpFormatter

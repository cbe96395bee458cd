"""The recipe stays outside the library proper: no vlens module imports vlens.recipes."""

from __future__ import annotations

import subprocess
import sys

CHECK = """
import importlib, pkgutil, sys
import vlens
names = []
def walk(package):  # pkgutil.walk_packages would import vlens.recipes itself to descend
    for info in pkgutil.iter_modules(package.__path__, package.__name__ + "."):
        if info.name.startswith("vlens.recipes") or info.name == "vlens.cli":
            continue
        names.append(info.name)
        module = importlib.import_module(info.name)
        if info.ispkg:
            walk(module)
walk(vlens)
leaked = sorted(n for n in sys.modules if n.startswith("vlens.recipes"))
print(len(names), leaked)
assert not leaked, leaked
"""


def test_library_modules_do_not_import_the_recipe():
    result = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]
    n_modules = int(result.stdout.split()[0])
    assert n_modules > 50  # the walk really covered the library


def test_zoo_commands_are_registered_by_the_dispatcher():
    from vlens.cli import build_parser

    args = build_parser().parse_args(["zoo", "evaluate", "--held-out", "3"])
    assert args.func.__module__ == "vlens.recipes.embedded.cli"

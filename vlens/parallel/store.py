"""Finished work units on disk, so that a failed or killed run resumes where it stopped.

A `UnitStore` is one folder per run. It holds `manifest.json` (the run's settings: a rerun
with other settings must not pick up these results) and one sub-folder per stage (one
`Sharding.map` call), which holds one file per finished unit, named by the unit's index.
The index identifies a unit independently of how many processes run it, so a run killed
with 4 processes can resume with 2, or with 1.

Files are written to a temporary name and renamed (atomic on POSIX), so a unit file is either
complete or absent. They are read back with `torch.load(weights_only=True)`: a unit result
must be plain data (tensors, numbers, strings, None, and lists / tuples / dicts of them).
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from vlens.utils.errors import UserInputError
from vlens.utils.fileio import atomic_write, atomic_write_json, load_tensor_file, read_json_file

MANIFEST = "manifest.json"
STAGE_FILE = "stage.json"
_PLAIN = (str, int, float, bool, type(None), torch.Tensor)


def plain_settings(settings: Mapping[str, Any]) -> dict[str, Any]:
    """JSON-comparable settings: values JSON cannot hold become their repr."""
    return json.loads(json.dumps(dict(settings), sort_keys=True, default=repr))


def check_plain(value: Any, where: str = "unit result") -> None:
    """Raise TypeError if `value` is not plain data that `torch.load(weights_only=True)` reads back."""
    if isinstance(value, _PLAIN):
        return
    if isinstance(value, list | tuple):
        for item in value:
            check_plain(item, where)
        return
    if isinstance(value, dict):
        for key, item in value.items():
            check_plain(key, where)
            check_plain(item, where)
        return
    raise TypeError(f"a {where} must be plain data (tensors, numbers, strings, None, lists / tuples / dicts of "
                    f"them) to be stored for resuming; got {type(value).__name__}")


def _write_json(path: Path, data: dict) -> None:
    atomic_write_json(path, data, sort_keys=True)


class StageStore:
    """The finished units of one stage (one `Sharding.map` call)."""

    def __init__(self, folder: Path, name: str, n_units: int):
        self.folder, self.name, self.n_units = folder, name, n_units

    def path(self, index: int) -> Path:
        return self.folder / f"unit-{index:07d}.pt"

    def has(self, index: int) -> bool:
        return self.path(index).is_file()

    def count(self) -> int:
        """Finished units on disk."""
        return sum(1 for i in range(self.n_units) if self.has(i))

    def save(self, index: int, result: Any) -> None:
        check_plain(result)
        atomic_write(self.path(index), lambda p: torch.save(result, p))

    def load(self, index: int) -> Any:
        return load_tensor_file(self.path(index), f"the finished unit {index} of {self.name!r}",
                                f"delete {self.path(index)} (that unit is computed again) and resume")


class UnitStore:
    """A run's folder of finished units (see the module docstring).

    Args:
        folder: where to keep them (created when first used), e.g. next to the run's output.
        settings: what the results depend on (the command's arguments); a folder written
            with other settings is refused with the differing keys named, never mixed in.
        replace_other: delete a folder written with other settings instead (e.g. --overwrite).
    """

    def __init__(self, folder: str | Path, settings: Mapping[str, Any], replace_other: bool = False):
        self.folder = Path(folder)
        self.settings = plain_settings(settings)
        self.replace_other = replace_other
        self._checked = False

    def open(self) -> None:
        """Create the folder, or check that its manifest has this run's settings."""
        if self._checked:
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        manifest = self.folder / MANIFEST
        if manifest.is_file():
            found = self._manifest_settings(manifest)
            if found != self.settings and self.replace_other:
                shutil.rmtree(self.folder, ignore_errors=True)
                self.folder.mkdir(parents=True, exist_ok=True)
                _write_json(manifest, {"settings": self.settings})
            elif found is not None and found != self.settings:
                keys = sorted(k for k in set(found) | set(self.settings) if found.get(k) != self.settings.get(k))
                raise UserInputError(
                    f"{self.folder} holds the finished units of a run with other settings (they differ in "
                    f"{', '.join(keys)}); resuming would mix two runs. Delete that folder to start over, or "
                    "rerun with the same arguments to resume it.")
        else:  # every rank may write it: the content is the same, the rename atomic
            _write_json(manifest, {"settings": self.settings})
        self._checked = True

    def _manifest_settings(self, manifest: Path) -> dict | None:
        """The settings the manifest records; None for a damaged one that --overwrite may replace."""
        fix = f"delete {self.folder} to start over"
        try:
            found = read_json_file(manifest, "the resume folder's manifest", fix)
        except UserInputError:
            if self.replace_other:
                return None
            raise
        if not isinstance(found, dict) or not isinstance(found.get("settings", {}), dict):
            if self.replace_other:
                return None
            raise UserInputError(f"the resume folder's manifest {manifest} holds no settings object: {fix}")
        return found.get("settings", {})

    def stage(self, index: int, name: str, n_units: int) -> StageStore:
        """The store of the `index`-th stage of the run (named `name`, `n_units` units)."""
        self.open()
        slug = re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-")[:60] or "stage"
        folder = self.folder / f"{index:03d}-{slug}"
        folder.mkdir(exist_ok=True)
        info = {"name": name, "n_units": n_units}
        stage_file = folder / STAGE_FILE
        if stage_file.is_file():
            found = read_json_file(stage_file, "the resume folder's stage file", f"delete {self.folder} to start over")
            if not isinstance(found, dict) or not {"name", "n_units"} <= set(found):
                raise UserInputError(f"the resume folder's stage file {stage_file} is damaged: delete {self.folder} "
                                     "to start over")
            if found != info:
                raise UserInputError(f"{folder} was written for {found['n_units']} units of {found['name']!r}, this run "
                                 f"has {n_units} units of {name!r}: delete {self.folder} to start over.")
        else:
            _write_json(stage_file, info)
        return StageStore(folder, name, n_units)

    def remove(self) -> None:
        """Delete the folder (after the run's output is written)."""
        shutil.rmtree(self.folder, ignore_errors=True)

"""Fault family "lost or overwritten files": model folders are written whole or not at all, an
existing model folder is replaced only with --overwrite (and then nothing stale is left), a user's
non-model folder is never replaced."""

from __future__ import annotations

import json

import pytest

from tests.helpers.faults import run_cli
from vlens.utils.errors import UserInputError
from vlens.utils.fileio import atomic_folder


def test_atomic_folder_keeps_the_old_folder_on_failure(tmp_path):
    target = tmp_path / "model"
    with atomic_folder(target) as staging:
        (staging / "config.json").write_text("{}")
        (staging / "MODEL_CARD.md").write_text("old card")
    with pytest.raises(RuntimeError, match="disk full"), atomic_folder(target, overwrite=True) as staging:
        (staging / "config.json").write_text('{"new": 1}')
        raise RuntimeError("disk full")
    assert (target / "MODEL_CARD.md").read_text() == "old card" and (target / "config.json").read_text() == "{}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]  # no temporary folder left
    with pytest.raises(UserInputError, match="already holds a model; pass --overwrite"), atomic_folder(target):
        pass
    with atomic_folder(target, overwrite=True) as staging:
        (staging / "config.json").write_text('{"new": 1}')
    assert sorted(p.name for p in target.iterdir()) == ["config.json"]  # the stale card is gone


def test_atomic_folder_never_replaces_a_users_folder(tmp_path):
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "thesis.tex").write_text("mine")
    with pytest.raises(UserInputError, match="not a model folder"), \
            atomic_folder(tmp_path / "notes", overwrite=True):
        pass
    assert (tmp_path / "notes" / "thesis.tex").read_text() == "mine"


def test_temperature_export_needs_overwrite_and_leaves_no_stale_files(tmp_path, capsys):
    temps = tmp_path / "temps.json"
    temps.write_text(json.dumps({"alpha": 1.2, "heads": [{"layer": 0, "head": 1, "beta": 1.2}]}))
    out = tmp_path / "baked"
    out.mkdir()
    (out / "config.json").write_text("{}")
    (out / "MODEL_CARD.md").write_text("a card for other weights")
    base = ["temperature", "export", "--model", "random-tiny", "--temps", str(temps), "--out", str(out)]
    code, err = run_cli(base, capsys)
    assert code == 2 and "--out" in err and "--overwrite" in err
    assert (out / "MODEL_CARD.md").exists()
    assert run_cli([*base, "--overwrite"], capsys)[0] == 0
    assert not (out / "MODEL_CARD.md").exists() and (out / "vlens_temperature.json").is_file()

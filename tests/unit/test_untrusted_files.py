"""Files vlens reads back never run code, and finished work survives an interrupted command.

Each resumable folder or cache gets a planted pickle payload (an object whose `__reduce__` would
create a marker file when unpickled): the payload must not run and the load must be a
`UserInputError` naming the file. A 0-byte or truncated file is named the same way. A sharded
command stopped by Ctrl-C or by a bug keeps its finished units, and the rerun computes only the rest.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import torch

from vlens.cli.console import run_command
from vlens.parallel.command import STORE_FOLDER
from vlens.parallel.store import UnitStore
from vlens.utils.errors import UserInputError
from vlens.utils.fileio import atomic_write_json, load_tensor_file, read_json_file


class Payload:
    """Unpickling this creates `marker` (stands in for any code a planted file would run)."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def _plant(path: Path, marker: Path, extra: dict | None = None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({**(extra or {}), "payload": Payload(marker)}, path)


def _refused(load, path: Path, marker: Path, match: str = "never unpickles") -> None:
    with pytest.raises(UserInputError, match=match) as caught:
        load()
    assert str(path) in str(caught.value)
    assert not marker.exists(), "the planted payload ran"


def test_the_payload_would_run_under_a_plain_unpickle(tmp_path):
    # the test's own control: without weights_only the planted file does run code
    _plant(tmp_path / "x.pt", tmp_path / "marker")
    torch.load(tmp_path / "x.pt", weights_only=False)
    assert (tmp_path / "marker").exists()


def test_tensor_files_refuse_payloads_and_name_empty_or_truncated_files(tmp_path):
    marker = tmp_path / "marker"
    _plant(tmp_path / "a.pt", marker)
    _refused(lambda: load_tensor_file(tmp_path / "a.pt", "the state"), tmp_path / "a.pt", marker)
    (tmp_path / "empty.pt").write_bytes(b"")
    _refused(lambda: load_tensor_file(tmp_path / "empty.pt"), tmp_path / "empty.pt", marker, "empty, truncated")
    torch.save({"w": torch.ones(500)}, tmp_path / "cut.pt")
    data = (tmp_path / "cut.pt").read_bytes()
    (tmp_path / "cut.pt").write_bytes(data[: len(data) // 2])
    _refused(lambda: load_tensor_file(tmp_path / "cut.pt"), tmp_path / "cut.pt", marker, "empty, truncated")
    torch.save({"w": torch.arange(3), "n": 2, "names": ["a"]}, tmp_path / "ok.pt")
    assert load_tensor_file(tmp_path / "ok.pt")["names"] == ["a"]


def test_zoo_training_state_with_a_payload_is_refused(tmp_path):
    from vlens.recipes.embedded.loop import STATE_FILE, TrainingState

    marker = tmp_path / "marker"
    _plant(tmp_path / "run" / STATE_FILE, marker, {"fingerprint": {"lr": 1}})
    _refused(lambda: TrainingState(tmp_path / "run", {"lr": 1}).load(), tmp_path / "run" / STATE_FILE, marker)
    # what the loop writes is plain data and loads back
    TrainingState(tmp_path / "ok", {"lr": 1}).save({"step": 3, "generator": torch.Generator().get_state()})
    assert TrainingState(tmp_path / "ok", {"lr": 1}).load()["step"] == 3


def test_recipe_rendered_image_cache_with_a_payload_is_refused_and_a_real_one_loads_back(tmp_path):
    import numpy as np

    from vlens.recipes.embedded.batches import EncodedExample
    from vlens.recipes.embedded.image_store import ImageStore
    from vlens.recipes.embedded.recipe import RENDERED_FILE, cached_training_set
    from vlens.recipes.embedded.training_set import RenderedSet

    marker = tmp_path / "marker"
    _plant(tmp_path / RENDERED_FILE, marker, {"fingerprint": {"seed": 1}})
    _refused(lambda: cached_training_set(tmp_path, None, None, False, {"seed": 1}), tmp_path / RENDERED_FILE, marker)

    images = ImageStore(4)
    images.append(np.arange(48, dtype=np.uint8).reshape(4, 4, 3))
    rendered = RenderedSet(images, [EncodedExample([1, 2], [-100, 2], 0)], ["colour"], torch.zeros(1, 3, 1))
    torch.save({"fingerprint": {"seed": 1}, "rendered": rendered.to_plain()}, tmp_path / RENDERED_FILE)
    back = cached_training_set(tmp_path, None, None, False, {"seed": 1})
    assert torch.equal(back.images[[0]], images[[0]]) and back.examples == rendered.examples
    assert back.sources == ["colour"] and torch.equal(back.cell_labels, rendered.cell_labels)


def test_sae_training_state_with_a_payload_is_refused(tmp_path):
    from vlens.sae.activations import TensorSource
    from vlens.sae.settings import SAETraining, TrainRun
    from vlens.sae.trainer import STATE_FILE, train_sae

    training = SAETraining(architecture="standard", d_sae=8, total_tokens=512, batch_size=64, buffer_size=256)
    x = torch.randn(256, 4)
    train_sae(TensorSource(x, 128), training, TrainRun(checkpoint_dir=tmp_path, stop_after=2, progress=False))
    marker = tmp_path / "marker"
    _plant(tmp_path / STATE_FILE, marker, {"training": {}})
    _refused(lambda: train_sae(TensorSource(x, 128), training, TrainRun(checkpoint_dir=tmp_path, resume=True)),
             tmp_path / STATE_FILE, marker)


def test_finished_unit_with_a_payload_is_refused(tmp_path):
    marker = tmp_path / "marker"
    stage = UnitStore(tmp_path / "store", {"a": 1}).stage(0, "units", 2)
    stage.save(0, {"value": torch.ones(2)})
    assert torch.equal(stage.load(0)["value"], torch.ones(2))
    _plant(stage.path(1), marker)
    _refused(lambda: stage.load(1), stage.path(1), marker)


def test_an_empty_or_truncated_resume_file_is_named(tmp_path):
    store = UnitStore(tmp_path / "store", {"a": 1})
    store.stage(0, "units", 2)
    manifest = tmp_path / "store" / "manifest.json"
    manifest.write_text("")
    with pytest.raises(UserInputError, match="manifest .*manifest.json is empty.*delete"):
        UnitStore(tmp_path / "store", {"a": 1}).open()
    manifest.write_text('{"settings": {"a": ')
    with pytest.raises(UserInputError, match="manifest.json is not valid JSON"):
        UnitStore(tmp_path / "store", {"a": 1}).open()
    UnitStore(tmp_path / "store", {"a": 1}, replace_other=True).open()  # --overwrite replaces a damaged one
    assert read_json_file(manifest) == {"settings": {"a": 1}}


def test_json_written_atomically_leaves_the_old_file_when_the_write_fails(tmp_path):
    path = tmp_path / "cfg.json"
    atomic_write_json(path, {"a": 1})
    with pytest.raises(TypeError):
        atomic_write_json(path, {"a": object()})  # fails half-way through serialising
    assert read_json_file(path) == {"a": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["cfg.json"]  # no temporary file left behind


# ------------------------------------------------------------------ interrupted sharded commands
def _command(out: Path, fail_at: int | None, error: type[BaseException], computed: list[int]):
    def func(args):
        def unit(index):
            if index == fail_at:
                raise error("stop")
            computed.append(index)
            return {"square": torch.tensor(float(index * index))}

        values = args.sharding.map(range(6), unit, desc="squares", progress=False)
        (Path(args.out) / "out.txt").write_text(" ".join(str(int(v["square"])) for v in values))
        return 0

    return argparse.Namespace(func=func, out=str(out), shardable=True, quiet=True, verbose=0, size=6,
                              command_prog="vlens test")


@pytest.mark.parametrize("error, status", [(KeyboardInterrupt, 130), (RuntimeError, 1)])
def test_an_interrupted_or_failed_sharded_command_keeps_its_finished_units(tmp_path, error, status):
    computed: list[int] = []
    assert run_command(_command(tmp_path, 3, error, computed)) == status
    assert computed == [0, 1, 2]
    assert len(list((tmp_path / STORE_FOLDER).glob("*/unit-*.pt"))) == 3  # kept for the rerun
    computed.clear()
    assert run_command(_command(tmp_path, None, error, computed)) == 0
    assert computed == [3, 4, 5]  # the rerun computes only what was missing
    assert (tmp_path / "out.txt").read_text() == "0 1 4 9 16 25"
    assert not (tmp_path / STORE_FOLDER).exists()  # removed once the output is written

"""Images vlens renders follow the model's own image size (issue 40): --image-size when given, else the
square size the model's processor pins (the embedded model, a recipe folder), else 168 px for a processor
with dynamic resolution.

The known answer: a recipe model folder saved at 84 px (3 x 3 image tokens, unlike the embedded model's
size and the fallback) must be drawn at 84 px, which a spy on the image processor sees arrive.
"""

from __future__ import annotations

import argparse
import json
import shutil

import pytest
import torch
from PIL import Image
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

from vlens.cli import main
from vlens.cli.options import rendered_size
from vlens.core.devices import configure_resolution
from vlens.demo.data_stage import counting_samples
from vlens.demo.settings import DemoSettings
from vlens.lens.corpus import task_samples
from vlens.patching.pairs import make_count_pairs
from vlens.recipes.embedded.recipe import build_untrained, save_model_folder
from vlens.testing.qwen import tiny_qwen_processor
from vlens.utils.errors import UserInputError
from vlens.zoo.image_sizes import (
    FALLBACK_IMAGE_SIZE,
    OBJECT_IMAGE_SIZE,
    WEIGHTS_FOLDER,
    embedded_image_size,
    folder_image_size,
    pinned_image_size,
    pinned_side,
    pixel_budget,
    render_size,
)
from vlens.zoo.processor import image_size_of, load_processor
from vlens.zoo.specs import load_model

torch.set_num_threads(1)

PINNED = 84  # 3 x 3 merged image tokens


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    path = tmp_path_factory.mktemp("pinned") / "model"
    _, processor, model = build_untrained(0, PINNED)
    save_model_folder(model, processor, path)
    return path


@pytest.fixture(scope="module")
def dynamic_folder(folder, tmp_path_factory):
    """The same model with Qwen's dynamic resolution (56^2 .. 448^2 pixels): a processor that pins no size."""
    path = tmp_path_factory.mktemp("dynamic") / "model"
    shutil.copytree(folder, path)
    config = json.loads((path / "preprocessor_config.json").read_text())
    config["size"] = {"shortest_edge": 56 * 56, "longest_edge": 448 * 448}
    (path / "preprocessor_config.json").write_text(json.dumps(config))
    return path


@pytest.fixture(scope="module")
def pinned_model(folder):
    return load_model(str(folder), device="cpu", dtype="float32", progress=False)


@pytest.fixture
def seen(monkeypatch):
    """(image size, image tokens) of every image the Qwen-VL image processor receives."""
    calls: list[tuple[tuple[int, int], int]] = []
    original = Qwen2VLImageProcessorPil.preprocess

    def flat(images):
        if isinstance(images, Image.Image):
            return [images]
        return [leaf for item in images for leaf in flat(item)]

    def spy(self, images, *args, **kwargs):
        out = original(self, images, *args, **kwargs)
        tokens = (out["image_grid_thw"].prod(-1) // self.merge_size ** 2).tolist()
        calls.extend(zip([image.size for image in flat(images)], tokens, strict=True))
        return out

    monkeypatch.setattr(Qwen2VLImageProcessorPil, "preprocess", spy)
    return calls


def test_pinned_side_reads_square_budgets_only():
    assert pinned_side(dict(zip(("shortest_edge", "longest_edge"), pixel_budget(196), strict=True))) == 196
    assert pinned_side({"shortest_edge": 112 * 112, "longest_edge": 112 * 112}) == 112  # --image-size pins exactly
    assert pinned_side({"shortest_edge": 56 * 56, "longest_edge": 28 * 28 * 1280}) is None  # Qwen2.5-VL's own range
    assert pinned_side(dict(zip(("shortest_edge", "longest_edge"), pixel_budget(100), strict=True))) is None  # not x28
    assert pinned_side({"height": 224, "width": 224}) is None and pinned_side(None) is None


def test_sizes_of_specs_folders_and_processors(folder, tmp_path):
    assert embedded_image_size() == image_size_of(load_processor(WEIGHTS_FOLDER))  # read from the shipped folder
    assert pinned_image_size("tiny") == embedded_image_size()
    assert folder_image_size(folder) == pinned_image_size(str(folder)) == PINNED
    assert pinned_image_size("random-tiny") is None and render_size("random-tiny") == FALLBACK_IMAGE_SIZE == 168
    assert render_size(str(folder), image_size=112) == 112 and render_size(str(folder)) == PINNED
    assert folder_image_size(tmp_path) is None  # no preprocessor config: dynamic
    processor = tiny_qwen_processor()
    assert pinned_image_size(processor) is None
    with pytest.raises(UserInputError, match="does not pin a square size"):
        image_size_of(processor)
    configure_resolution(processor, image_size=112)  # what --image-size does to a loaded processor
    assert pinned_image_size(processor) == image_size_of(processor) == 112


def test_library_defaults_draw_at_the_embedded_size_and_explicit_sizes_win(pinned_model):
    side = embedded_image_size()
    pair = make_count_pairs(1)[0]
    assert pair.clean_image.size == pair.corrupt_image.size == (side, side)
    assert make_count_pairs(1, size=112)[0].clean_image.size == (112, 112)
    assert task_samples(1)[0][0].size == (side, side) and task_samples(1, size=56)[0][0].size == (56, 56)
    assert DemoSettings().image_side == side and DemoSettings(image_size=112).image_side == 112
    settings = DemoSettings().for_model(pinned_model)
    assert settings.image_size == PINNED
    assert {s.image.size for s in counting_samples(settings, n=2)} == {(PINNED, PINNED)}
    assert DemoSettings(image_size=112).for_model(pinned_model).image_size == 112
    assert DemoSettings().for_model(load_model("random-tiny", progress=False)).image_size == FALLBACK_IMAGE_SIZE


@pytest.mark.parametrize("command", [["logit-lens", "--make", "2"], ["patch", "--make-pairs", "1", "--mode", "atp"],
                                     ["ablate", "--tasks", "colour", "--n-examples", "2", "--n-reference", "2",
                                      "--top-k", "2"]])
def test_commands_render_at_the_pinned_size_unless_told(command, folder, seen, tmp_path):
    assert main([*command, "--model", str(folder), "--out", str(tmp_path / "a"), "--quiet"]) == 0
    assert seen and set(seen) == {((PINNED, PINNED), (PINNED // 28) ** 2)}
    seen.clear()
    assert main([*command, "--model", str(folder), "--image-size", "112", "--out", str(tmp_path / "b"), "--quiet"]) == 0
    assert seen and set(seen) == {((112, 112), 16)}  # drawn at 112 and the processor pinned to 112


@pytest.mark.parametrize("command", [["knockout", "--task", "colour", "--n", "2", "--window", "4"],
                                     ["study", "flow", "--task", "colour", "--n", "2", "--window", "4"]])
def test_object_tasks_render_at_the_pinned_size_else_64(command, folder, dynamic_folder, seen, tmp_path):
    assert main([*command, "--model", str(folder), "--out", str(tmp_path / "a"), "--quiet"]) == 0
    assert seen and set(seen) == {((PINNED, PINNED), (PINNED // 28) ** 2)}
    seen.clear()
    assert pinned_image_size(str(dynamic_folder)) is None
    assert main([*command, "--model", str(dynamic_folder), "--out", str(tmp_path / "b"), "--quiet"]) == 0
    assert seen and set(seen) == {((OBJECT_IMAGE_SIZE, OBJECT_IMAGE_SIZE), 4)}  # kept near 64 px: 2 x 2 tokens


def test_dynamic_resolution_falls_back_to_168(seen, tmp_path):
    assert main(["logit-lens", "--make", "2", "--model", "random-tiny", "--out", str(tmp_path), "--quiet"]) == 0
    assert seen and set(seen) == {((168, 168), 36)}  # random-tiny keeps the drawn size: 6 x 6 tokens


def test_rendered_size_reads_the_model_of_the_arguments(folder):
    args = argparse.Namespace(model=str(folder), image_size=None)
    assert rendered_size(args) == PINNED and rendered_size(args, 64) == 64  # a command's own fixed size
    args.image_size = 56
    assert rendered_size(args) == 56
    assert rendered_size(argparse.Namespace(model=None, image_size=None)) == embedded_image_size()  # --model unread yet


@pytest.mark.parametrize("command", [["logit-lens"], ["patch"], ["circuit"], ["lens", "train"], ["headlens"],
                                     ["routing"], ["sae", "train"], ["sae", "dashboard"], ["transcoder", "train"],
                                     ["graph"], ["demo"], ["ablate"]])
def test_help_of_every_rendering_command_says_the_model_size_is_the_default(command, capsys):
    with pytest.raises(SystemExit) as exit_:
        main([*command, "--help"])
    assert exit_.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert f"the square size the model's processor pins, {embedded_image_size()} for tiny" in text

"""`vlens zoo train --render-only`: a stage's training set rendered ahead (while the stage before it
trains) is the one the stage would render, and its run reads it instead of rendering."""

from __future__ import annotations

import pytest
import torch

from vlens.cli import main
from vlens.recipes.embedded import recipe
from vlens.recipes.embedded.recipe import RENDERED_FILE, build_untrained, render_key, save_model_folder
from vlens.recipes.embedded.settings import RecipeSettings
from vlens.recipes.embedded.training_set import RenderedSet, render_training_set
from vlens.utils.fileio import load_tensor_file

# 56 px images (2 x 2 image tokens), 6 examples, 2 steps: a whole stage in seconds
DATA = "--seed 3 --examples 6 --mix existence=1,colour=1 --minimal-pairs".split()
RUN = "--batch-size 2 --steps 2 --warmup 1 --held-out 1 --probe-scenes 6 --checkpoint-every 1 --quiet".split()


def _folder(path, seed: int):
    _, processor, model = build_untrained(seed=seed, image_size=56, text_layers=1)
    save_model_folder(model, processor, path)
    return processor


def test_a_set_rendered_ahead_is_the_stages_own_and_its_run_does_not_render_again(tmp_path, monkeypatch):
    processor = _folder(tmp_path / "earlier", seed=1)
    # the stage's real starting point: a stage the recipe wrote (other weights, same size)
    assert main(["zoo", "train", "--out", str(tmp_path / "before"), "--image-size", "56", "--text-layers", "1",
                 "--seed", "2", "--examples", "4", *RUN]) == 0
    out = tmp_path / "stage"
    # rendered from "earlier" (only its image size is read), with another thread count
    assert main(["zoo", "train", "--out", str(out), "--init-from", str(tmp_path / "earlier"), *DATA, *RUN,
                 "--threads", "2", "--render-only"]) == 0
    assert not out.exists() and not (tmp_path / "stage.checkpoint" / "state.pt").exists()
    saved = load_tensor_file(tmp_path / "stage.checkpoint" / RENDERED_FILE, "set", "")
    ahead = RenderedSet.from_plain(saved["rendered"])
    fresh = render_training_set(processor, 6, seed=3, progress=False, mix={"existence": 1.0, "colour": 1.0},
                                minimal_pairs=True)
    assert ahead.examples == fresh.examples and torch.equal(ahead.images[list(range(6))],
                                                             fresh.images[list(range(6))])
    assert ahead.partners == fresh.partners

    def no_rendering(*args, **kwargs):
        raise AssertionError("the stage rendered its set again")

    monkeypatch.setattr(recipe, "render_training_set", no_rendering)
    assert main(["zoo", "train", "--out", str(out), "--init-from", str(tmp_path / "before"), *DATA, *RUN,
                 "--threads", "1"]) == 0
    assert (out / "model.safetensors").is_file() and not (tmp_path / "stage.checkpoint").exists()


def test_other_data_settings_or_image_size_render_again(tmp_path, monkeypatch):
    _folder(tmp_path / "earlier", seed=1)
    out = tmp_path / "stage"
    assert main(["zoo", "train", "--out", str(out), "--init-from", str(tmp_path / "earlier"), *DATA, *RUN,
                 "--render-only"]) == 0
    calls = []
    real = recipe.render_training_set

    def counted(*args, **kwargs):
        calls.append(args[2])  # the seed
        return real(*args, **kwargs)

    monkeypatch.setattr(recipe, "render_training_set", counted)
    assert main(["zoo", "train", "--out", str(out), "--init-from", str(tmp_path / "earlier"), *DATA, *RUN,
                 "--seed", "4", "--render-only"]) == 0
    assert calls == [4]
    base = RecipeSettings(seed=3, n_examples=6)
    processor = build_untrained(seed=0, image_size=56, text_layers=1)[1]
    larger = build_untrained(seed=0, image_size=84, text_layers=1)[1]
    assert render_key(base, processor) == render_key(RecipeSettings(seed=3, n_examples=6, threads=2,
                                                                    init_from="x"), processor)
    assert render_key(base, processor) != render_key(base, larger)
    assert render_key(base, processor) != render_key(RecipeSettings(seed=3, n_examples=6, minimal_pairs=True),
                                                     processor)


def test_render_only_without_an_image_size_source_is_one_clear_error(tmp_path, capsys):
    code = main(["zoo", "train", "--out", str(tmp_path / "s"), "--init-from", str(tmp_path / "missing"), *DATA,
                 "--render-only"])
    assert code == 2
    assert "--image-size" in capsys.readouterr().err


@pytest.mark.parametrize("flag", ["--resume", "--stop-after"])
def test_render_only_refuses_flags_that_only_a_run_reads(tmp_path, capsys, flag):
    extra = [flag] if flag == "--resume" else [flag, "1"]
    code = main(["zoo", "train", "--out", str(tmp_path / "s"), "--image-size", "56", *DATA, *extra,
                 "--render-only"])
    assert code == 2
    assert flag in capsys.readouterr().err

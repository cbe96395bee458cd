"""Training-time appearance variety keeps every scene's meaning; images and labels move together."""

from __future__ import annotations

import colorsys

import numpy as np
import pytest
import torch

from vlens.data import make_task_sample
from vlens.data.palette import COLOR_PALETTE
from vlens.recipes.embedded.appearance import HUE_RANGES, id_map_of, photometric, redraw, shade_of
from vlens.recipes.embedded.image_store import ImageStore
from vlens.recipes.embedded.training_set import (
    HELD_OUT_ONLY,
    TRAINING_MIX,
    parse_mix,
    training_sources,
    varied_sample,
)
from vlens.recipes.embedded.vision_aux import SHAPE_CLASSES, dense_labels
from vlens.recipes.embedded.vision_pretrain import dihedral


def _hue(rgb) -> float:
    return 360.0 * colorsys.rgb_to_hsv(*(c / 255 for c in rgb))[0]


def _in_range(hue: float, low: float, high: float) -> bool:
    return any(low <= h <= high for h in (hue, hue - 360.0))


@pytest.mark.parametrize("colour", sorted(HUE_RANGES))
def test_shades_keep_their_colour_name(colour):
    rng = np.random.default_rng(0)
    palette_hue = _hue(COLOR_PALETTE[colour])
    assert _in_range(palette_hue, *HUE_RANGES[colour])  # the palette colour is one of its own shades
    for _ in range(200):
        hue = _hue(shade_of(colour, rng))
        low, high = HUE_RANGES[colour]
        assert _in_range(hue, low - 1.5, high + 1.5), (colour, hue)  # 8-bit rounding moves hue a little
        others = [name for name in HUE_RANGES if name != colour]
        assert not any(_in_range(hue, *HUE_RANGES[name]) for name in others)


def test_black_shades_stay_dark():
    rng = np.random.default_rng(1)
    assert all(max(shade_of("black", rng)) <= 60 for _ in range(100))


def test_redraw_keeps_layout_and_marks_every_object():
    image, record = make_task_sample("shape", 3, size=224, style="synpoly", counts=range(1, 6))
    for seed in range(8):
        redrawn, id_map = redraw(record, np.random.default_rng(seed))
        assert redrawn.size == image.size
        for obj in record["objects"]:
            x, y = (int(round(c)) for c in obj["center"])
            assert id_map[y, x] == obj["id"]  # the object is where the record says
            assert (id_map == obj["id"]).sum() > 0.3 * np.pi * obj["size"] ** 2
    canonical = id_map_of(record)
    labels = dense_labels(canonical, record["objects"], 8)
    assert set(labels[0][labels[0] > 0].tolist()) <= {
        SHAPE_CLASSES.index(o["shape"]) for o in record["objects"]
    }


def test_id_map_matches_the_data_modules_pixels():
    image, record = make_task_sample("counting", 5, size=224, style="synpoly", counts=[4])
    pixels = np.asarray(image).astype(int)
    id_map = id_map_of(record)
    inside = id_map >= 0
    # white background everywhere outside the objects, object colours inside them
    assert (pixels[~inside] >= 250).all() or (pixels[~inside].mean(-1) >= 250).mean() > 0.99
    for obj in record["objects"]:
        mean = pixels[id_map == obj["id"]].mean(0)
        assert np.abs(mean - np.array(obj["rgb"])).max() < 40


def test_photometric_changes_are_mild_and_deterministic():
    image, _ = make_task_sample("colour", 1, size=224, style="synpoly")
    a = [np.asarray(photometric(image, np.random.default_rng(seed))) for seed in range(30)]
    b = [np.asarray(photometric(image, np.random.default_rng(seed))) for seed in range(30)]
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert any(not np.array_equal(x, np.asarray(image)) for x in a)
    assert max(np.abs(x.astype(int) - np.asarray(image).astype(int)).mean() for x in a) < 12


def test_image_store_round_trip():
    store = ImageStore(28)
    rng = np.random.default_rng(0)
    arrays = [rng.integers(0, 256, (28, 28, 3), dtype=np.uint8) for _ in range(3)]
    for array in arrays:
        store.append(array)
    batch = store[[2, 0]]
    assert batch.dtype == torch.uint8 and batch.shape == (2, 28, 28, 3)
    assert np.array_equal(batch[0].numpy(), arrays[2]) and np.array_equal(store[1].numpy(), arrays[1])
    with pytest.raises(ValueError, match="uint8"):
        store.append(np.zeros((28, 28, 3), dtype=np.float32))


def test_dihedral_moves_labels_with_the_pixels():
    # one white pixel block in cell (0, 1) of a 2 x 2 grid of 4-px cells, labelled 5 there
    image = torch.zeros(1, 8, 8, 3, dtype=torch.uint8)
    image[0, 1:3, 5:7] = 255
    labels = torch.zeros(1, 3, 4, dtype=torch.long)
    labels[0, :, 1] = 5
    generator = torch.Generator().manual_seed(0)
    for _ in range(16):
        turned, moved = dihedral(image, labels, generator)
        cells = turned[0].float().mean(-1).view(2, 4, 2, 4).mean((1, 3)).flatten()
        assert int(cells.argmax()) == int(moved[0, 0].argmax()) and moved[0].sum() == 15


def test_training_examples_are_varied_and_the_foreign_renderer_is_held_out():
    assert not set(HELD_OUT_ONLY) & set(TRAINING_MIX)
    with pytest.raises(ValueError, match="held out of every training stage"):
        parse_mix("foreign/colour=1")
    with pytest.raises(ValueError, match="held out"):
        training_sources(4, 0, {"foreign/counting": 1.0})
    # the shipped model's stages trained on the second dot renderer: their commands parse
    assert parse_mix("counting/syndot=0.1,counting/dot_variants=0.05") == {
        "counting/syndot": 0.1, "counting/dot_variants": 0.05}
    from vlens.recipes.embedded.training_set import source_makers

    makers = source_makers(vary=True)
    redrawn = 0
    for seed in range(12):
        image, id_map, record = varied_sample(makers["counting/synpoly"], seed)
        canonical, _ = makers["counting/synpoly"](seed)
        redrawn += not np.array_equal(np.asarray(image), np.asarray(canonical.convert("RGB")))
        assert id_map.shape == (record["image_size"],) * 2
        assert sorted(set(id_map[id_map >= 0].tolist())) == [o["id"] for o in record["objects"]]
    assert redrawn >= 6

"""Methods on anyres (tiled) images: L_focus lays its prior on the base view and on the high-resolution
tiles through the pixel box of each (against a hand computation on one 80 x 64 LLaVA-NeXT image);
the pixel boxes of an image's tiles hold the pixels the processor put in them; the ablation's
"region" alignment keys a tiled image's tokens by tile."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from vlens import HookedVLM
from vlens.interventions.focus import focus_prior
from vlens.testing import random_image, tiny_llava_next_model, tiny_llava_next_processor

PINPOINTS = [[64, 96], [32, 32]]


@pytest.fixture(scope="module")
def next_model():
    hf = tiny_llava_next_model(seed=2, tile=32, patch_size=8, pinpoints=PINPOINTS)
    return HookedVLM.from_hf(hf, processor=tiny_llava_next_processor(tile=32, patch_size=8, pinpoints=PINPOINTS))


def test_prior_on_base_view_and_tiles_by_hand(next_model):
    """80 x 64 image, 2 x 3 tiles of 4 x 4 tokens; unpadding keeps a uniform 8 x 10 grid of 8-px cells
    covering the image exactly, and the base view squashes the image onto 4 x 4 cells."""
    inputs = next_model.prepare(images=[random_image(80, 64, 1)], prompts=["red"])
    x, y, sigma = 12.0, 16.0, 1.0
    prior = focus_prior(inputs, [[([(x, y)], (80, 64))]], sigma=sigma, model=next_model)
    first = int(inputs.regions.images[0][0][0])

    def gaussian(rows, cols, centre):
        r, c = torch.meshgrid(torch.arange(rows, dtype=torch.float64), torch.arange(cols, dtype=torch.float64),
                              indexing="ij")
        return torch.exp(-((r - centre[0]) ** 2 + (c - centre[1]) ** 2) / (2 * sigma**2))

    expected = torch.zeros(inputs.input_ids.shape[1], dtype=torch.float64)
    base = gaussian(4, 4, (y * 4 / 64 - 0.5, x * 4 / 80 - 0.5))
    expected[first:first + 16] = base.flatten()
    high = gaussian(8, 10, (y / 8 - 0.5, x / 8 - 0.5))  # one Gaussian across the tile borders
    for r in range(8):
        expected[first + 16 + 11 * r:first + 16 + 11 * r + 10] = high[r]
    expected /= expected.sum()
    torch.testing.assert_close(prior.weights[0], expected, atol=1e-10, rtol=0)
    assert prior.weights[0, inputs.regions.tile_positions(0, "newline")].abs().max() == 0
    assert bool(prior.valid[0])


@pytest.mark.parametrize("width,height", [(80, 64), (40, 32), (120, 96)])  # kept, upscaled x2, downscaled
def test_tile_boxes_hold_the_pixels_the_processor_put_in_each_tile(next_model, width, height):
    """An image whose red channel is its x coordinate, green its y and blue full (the padding is black):
    the pixels the processor put in each tile span the original coordinates its box names."""
    xs, ys = np.meshgrid(np.arange(width), np.arange(height))
    scale = 2 if width <= 80 else 1  # colours up to 240
    picture = Image.fromarray(np.stack([xs * scale, ys * scale, np.full_like(xs, 255)], -1).astype(np.uint8))
    inputs = next_model.prepare(images=[picture], prompts=["red"])
    image_processor = next_model.processor.image_processor
    mean, std = torch.tensor(image_processor.image_mean), torch.tensor(image_processor.image_std)
    pixels = (inputs.pixel_values[0] * std[:, None, None] + mean[:, None, None]) * 255  # [tiles, 3, 32, 32]
    records = [r for r in inputs.regions.tiles[0][0] if r.kind == "tile"]
    assert len(records) == 6
    for record in records:
        x0, y0, x1, y1 = record.box
        tile = pixels[record.index]
        assert divmod(record.index - 1, 3) == record.layout
        on_image = tile[2] > 128
        seen_x, seen_y = tile[0][on_image] / scale, tile[1][on_image] / scale
        # pixel k covers [k, k + 1): the box's edges, within the resize's rounding (1.5 original px)
        tol = 1.5
        assert abs(float(seen_x.min()) - x0) <= tol and abs(float(seen_x.max()) + 1 - x1) <= tol, (record, seen_x)
        assert abs(float(seen_y.min()) - y0) <= tol and abs(float(seen_y.max()) + 1 - y1) <= tol, (record, seen_y)


def test_region_alignment_keys_tiled_tokens_by_tile(next_model):
    from vlens.ablation.reference import row_position_keys

    inputs = next_model.prepare(images=[random_image(80, 64, 1), random_image(40, 40, 2)], prompts=["red", "red"])
    keyed = []
    for row in range(2):
        positions, keys = row_position_keys(inputs.regions, row, "region")
        keyed.append(dict(zip(positions.tolist(), keys, strict=True)))
        for record in inputs.regions.tiles[row][0]:
            got = [keyed[row][int(p)] for p in record.positions]
            assert got == [("image", 0, record.kind, record.layout, *record.grid, k) for k in range(len(got))]
    base = [set(k for k in keys.values() if k[2:3] == ("base",)) for keys in keyed]
    assert base[0] == base[1] and len(base[0]) == 16  # the base view is the same slot in both images
    tiles = [set(k for k in keys.values() if k[2:3] == ("tile",)) for keys in keyed]
    # both tile 2 x 3, but unpadding keeps 3 + 4 + 3 token columns of the 80 x 64 image and 2 + 4 + 2 of the
    # square one: the edge tiles are other slots, the middle ones the same
    assert tiles[0] != tiles[1] and tiles[0] & tiles[1]

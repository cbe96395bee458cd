"""L_focus object centres through each family's real preprocessing, on non-square images,
against hand computations (Qwen's smart_resize; LLaVA's CLIP resize + centre crop)."""

from __future__ import annotations

import pytest
import torch
from PIL import Image, ImageDraw

from tests.helpers.region_geometry import smart_resize_by_hand
from vlens import HookedVLM
from vlens.interventions.focus import focus_prior
from vlens.testing import tiny_hf_model, tiny_llava_model, tiny_llava_processor, tiny_qwen_processor


@pytest.fixture(scope="module")
def qwen():
    return HookedVLM.from_hf(tiny_hf_model("qwen2_5_vl", seed=0), processor=tiny_qwen_processor())


@pytest.fixture(scope="module")
def llava():
    return HookedVLM.from_hf(tiny_llava_model(), processor=tiny_llava_processor(image_size=32, patch_size=8))


@pytest.mark.parametrize("size,point", [((150, 60), (75, 45)), ((600, 100), (300, 50)), ((40, 130), (10, 100))])
def test_qwen_centres_follow_smart_resize(qwen, size, point):
    width, height = size
    inputs = qwen.prepare(images=[Image.new("RGB", size)], prompts=["How many?"])
    h, w = smart_resize_by_hand(height, width)
    grid = (h // 28, w // 28)
    assert inputs.regions.image_grid[0] == [grid]  # the processor's grid is the hand computation
    coords, visible = qwen.adapter.image_points_to_grid(qwen.processor, torch.tensor([point], dtype=torch.float64),
                                                        size, grid)
    by_hand = (point[1] * grid[0] / height - 0.5, point[0] * grid[1] / width - 0.5)
    assert torch.allclose(coords[0], torch.tensor(by_hand, dtype=torch.float64)) and bool(visible[0])
    prior = focus_prior(inputs, [[([point], size)]], sigma=0.3, model=qwen)
    cell = int(prior.weights[0, inputs.regions.images[0][0]].argmax())
    assert divmod(cell, grid[1]) == (round(by_hand[0]), round(by_hand[1]))


def test_llava_centres_follow_clip_resize_and_centre_crop(llava):
    # 50 x 20 -> shortest edge 32: 80 x 32 (x and y scale 1.6) -> centre crop 32 x 32 from x = 24
    points = torch.tensor([[25.0, 10.0], [5.0, 10.0], [34.0, 2.5]], dtype=torch.float64)
    coords, visible = llava.adapter.image_points_to_grid(llava.processor, points, (50, 20), (4, 4))
    assert visible.tolist() == [True, False, True]
    by_hand = [((10 * 1.6) * 4 / 32 - 0.5, (25 * 1.6 - 24) * 4 / 32 - 0.5),
               ((2.5 * 1.6) * 4 / 32 - 0.5, (34 * 1.6 - 24) * 4 / 32 - 0.5)]
    assert torch.allclose(coords[visible], torch.tensor(by_hand, dtype=torch.float64))
    # a tall image: 20 x 50 -> 32 x 80 -> crop from y = 24
    coords, visible = llava.adapter.image_points_to_grid(llava.processor, torch.tensor([[10.0, 25.0]]),
                                                         (20, 50), (4, 4))
    assert torch.allclose(coords[0], torch.tensor([(25 * 1.6 - 24) * 4 / 32 - 0.5, 10 * 1.6 * 4 / 32 - 0.5],
                                                  dtype=coords.dtype))


def test_llava_map_lands_where_the_processor_puts_the_pixels(llava):
    image = Image.new("RGB", (50, 20), "black")
    ImageDraw.Draw(image).rectangle([29, 7, 32, 10], fill="white")  # centre (31, 9) in pixel units
    pixels = llava.processor.image_processor(images=[image], return_tensors="pt")["pixel_values"][0, 0]
    bright = (pixels > (pixels.max() + pixels.min()) / 2).double()  # the square, after resize and crop
    rows, cols = torch.meshgrid(torch.arange(32.0), torch.arange(32.0), indexing="ij")
    centre = torch.stack([(rows * bright).sum(), (cols * bright).sum()]).double() / bright.sum()
    coords, _ = llava.adapter.image_points_to_grid(llava.processor, torch.tensor([[31.0, 9.0]], dtype=torch.float64), (50, 20),
                                                   (32, 32))
    assert torch.allclose(coords[0], centre, atol=0.5)  # a 1-pixel grid: within half a pixel


def test_objects_cropped_away_get_no_prior_mass(llava):
    image = Image.new("RGB", (50, 20))
    inputs = llava.prepare(images=[image, image], prompts=["How many?", "How many?"])
    prior = focus_prior(inputs, [[([(3.0, 10.0)], (50, 20))], [([(25.0, 10.0)], (50, 20))]], model=llava)
    assert prior.valid.tolist() == [False, True]  # row 0's only object lies in the cropped-off margin
    assert float(prior.weights[0].sum()) == 0.0 and float(prior.weights[1].sum()) == pytest.approx(1.0)

"""Image regions from geometry (`inputs.regions.from_box` / `from_mask` / `from_points` / `token_box`,
`TokenSelection.buffer`), against hand-computed geometry: Qwen's smart resize + 2x2 merge and LLaVA's
resize + centre crop by hand, a box that is exactly one token's pixels, coverage sums equal to the
box's area, a mask equal to its box, Neo et al.'s buffer on a known grid, and one clear error per bad
input. The per-family checks against each processor's own pixels are in test_image_regions_families.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.helpers.models import tiny_vlm
from tests.helpers.region_geometry import smart_resize_by_hand
from vlens.testing import random_image
from vlens.utils.errors import UserInputError


@pytest.fixture(scope="module")
def qwen():
    return tiny_vlm("qwen2_5_vl")


@pytest.fixture(scope="module")
def llava():
    return tiny_vlm("llava")



@pytest.mark.parametrize("width,height", [(90, 50), (41, 170), (600, 100), (13, 9)])  # wide, tall, over max, tiny
def test_qwen_token_boxes_by_hand(qwen, width, height):
    """Each merged token covers W / cols x H / rows original pixels (smart resize squashes, 28 px per token)."""
    inputs = qwen.prepare(images=[random_image(width, height, 1)], prompts=["red"])
    h, w = smart_resize_by_hand(height, width)
    rows, cols = h // 28, w // 28
    assert inputs.regions.image_grid[0][0] == (rows, cols)
    positions = inputs.regions.images[0][0]
    for k in (0, cols - 1, rows * cols - 1, (rows // 2) * cols + cols // 2):
        r, c = divmod(k, cols)
        expected = (c * width / cols, r * height / rows, (c + 1) * width / cols, (r + 1) * height / rows)
        assert inputs.regions.token_box(0, int(positions[k])) == pytest.approx(expected, abs=1e-9)
    label = inputs.regions.from_points(0, [[width - 0.5, height - 0.5]]).labels
    assert label == [f"img0[r{rows - 1},c{cols - 1}]"]


def test_box_of_one_token_selects_it_with_coverage_one(qwen):
    inputs = qwen.prepare(images=[random_image(150, 70, 2)], prompts=["red"])
    positions = inputs.regions.images[0][0]
    for k in range(len(positions)):
        box = inputs.regions.token_box(0, int(positions[k]))
        selection = inputs.regions.from_box(0, box)
        assert selection.positions.tolist() == [int(positions[k])]
        assert selection.coverage.tolist() == pytest.approx([1.0])


@pytest.mark.parametrize("box", [(3.5, 7.25, 101.0, 40.5), (0, 0, 150, 70), (149, 69, 150, 70)])
def test_coverage_sums_to_the_box_area(qwen, box):
    """sum over tokens of coverage x token area = the box's area (the tokens tile the image)."""
    inputs = qwen.prepare(images=[random_image(150, 70, 2)], prompts=["red"])
    selection = inputs.regions.from_box(0, box)
    geometry = selection.geometry
    order = torch.argsort(geometry.positions)
    areas = geometry.areas[order][torch.searchsorted(geometry.positions[order], selection.positions)]
    area = (box[2] - box[0]) * (box[3] - box[1])
    assert float((selection.coverage * areas).sum()) == pytest.approx(area, rel=1e-9)
    assert bool((selection.coverage > 0).all()) and bool((selection.coverage <= 1 + 1e-12).all())


def test_mask_of_a_box_equals_the_box(qwen):
    """A pixel mask of an integer box gives the box's coverage exactly; a ring covers the ring's share."""
    inputs = qwen.prepare(images=[random_image(150, 70, 2)], prompts=["red"])
    mask = torch.zeros(70, 150, dtype=torch.bool)
    mask[11:53, 20:97] = True
    by_mask = inputs.regions.from_mask(0, mask)
    by_box = inputs.regions.from_box(0, (20, 11, 97, 53))
    assert by_mask.positions.tolist() == by_box.positions.tolist()
    torch.testing.assert_close(by_mask.coverage, by_box.coverage, atol=1e-12, rtol=0)
    assert inputs.regions.from_mask(0, mask.numpy().astype(np.uint8)).positions.tolist() == by_box.positions.tolist()
    corner = torch.zeros(70, 150, dtype=torch.bool)
    corner[0:10, 0:10] = True  # 100 px, all inside the first cell
    selection = inputs.regions.from_mask(0, corner)
    x0, y0, x1, y1 = selection.geometry.boxes[0].tolist()
    assert selection.labels == ["img0[r0,c0]"]
    assert float(selection.coverage[0]) == pytest.approx(100 / ((x1 - x0) * (y1 - y0)))


def test_threshold_and_positions_at(qwen):
    inputs = qwen.prepare(images=[random_image(150, 70, 2)], prompts=["red"])
    loose = inputs.regions.from_box(0, (10, 10, 80, 60))
    strict = inputs.regions.from_box(0, (10, 10, 80, 60), threshold=0.5)
    assert strict.positions.tolist() == loose.positions_at(0.5).tolist()
    assert bool((strict.coverage > 0.5).all()) and len(strict) < len(loose)


def test_llava_crop_by_hand(llava):
    """CLIP resize (shortest edge 32) + centre crop 32 x 32 of a 96 x 48 image: the crop keeps original
    x in [24, 72); its 4 x 4 tokens are 12 x 12 px; the cropped-away sides cover no token."""
    inputs = llava.prepare(images=[random_image(96, 48, 3)], prompts=["red"])
    positions = inputs.regions.images[0][0]
    assert len(positions) == 16
    assert inputs.regions.token_box(0, int(positions[0])) == pytest.approx((24.0, 0.0, 36.0, 12.0))
    assert inputs.regions.token_box(0, int(positions[15])) == pytest.approx((60.0, 36.0, 72.0, 48.0))
    assert len(inputs.regions.from_box(0, (0, 0, 24, 48))) == 0  # the left margin is cropped away
    assert len(inputs.regions.from_box(0, (72, 0, 96, 48))) == 0
    half = inputs.regions.from_box(0, (18, 0, 30, 12))  # half in the margin, half on token (0, 0)
    assert half.labels == ["img0[r0,c0]"] and half.coverage.tolist() == pytest.approx([0.5])


def test_buffer_is_neo_et_al_dilation(qwen):
    """buffer(k): every token within k cells (8-neighbourhood) of a selected one, on the same grid."""
    inputs = qwen.prepare(images=[random_image(196, 196, 4)], prompts=["red"])  # 7 x 7 tokens of 28 px
    assert inputs.regions.image_grid[0][0] == (7, 7)
    centre = inputs.regions.from_points(0, [[3.5 * 28, 3.5 * 28]])
    assert centre.labels == ["img0[r3,c3]"]
    one = centre.buffer(1)
    assert sorted(one.labels) == sorted(f"img0[r{r},c{c}]" for r in range(2, 5) for c in range(2, 5))
    assert len(centre.buffer(2)) == 25 and len(centre.buffer(0)) == 1
    assert float(one.coverage.sum()) == 1.0  # buffer tokens carry no coverage of their own
    corner = inputs.regions.from_points(0, [[0, 0]]).buffer(1)
    assert sorted(corner.labels) == ["img0[r0,c0]", "img0[r0,c1]", "img0[r1,c0]", "img0[r1,c1]"]


def test_second_image_and_second_row(qwen):
    """image_index counts the batch's images row by row; positions are in that image's row."""
    inputs = qwen.prepare(images=[[random_image(56, 56, 1), random_image(84, 56, 2)], random_image(56, 84, 3)],
                          prompts=["red", "blue"])
    second = inputs.regions.from_box(1, (0, 0, 84, 56))
    assert second.row == 0 and second.positions.tolist() == inputs.regions.images[0][1].tolist()
    third = inputs.regions.from_box(2, (0, 0, 56, 84))
    assert third.row == 1 and third.positions.tolist() == inputs.regions.images[1][0].tolist()
    assert third.labels[0] == "img2[r0,c0]"


@pytest.mark.parametrize("box,words", [
    ((0, 0, 200, 20), "outside"), ((-1, 0, 10, 10), "outside"), ((10, 10, 10, 20), "empty"),
    ((20, 10, 10, 20), "empty"), ((0, float("nan"), 10, 10), "NaN"), ((0, 0, 10), "not 4"),
    ("abcd", "not four numbers"), (None, "not four numbers"),
])
def test_bad_boxes_are_one_clear_error(qwen, box, words):
    inputs = qwen.prepare(images=[random_image(90, 50, 1)], prompts=["red"])
    with pytest.raises(UserInputError, match=words):
        inputs.regions.from_box(0, box)


def test_other_bad_input(qwen):
    inputs = qwen.prepare(images=[random_image(90, 50, 1)], prompts=["red"])
    regions = inputs.regions
    with pytest.raises(UserInputError, match="out of range"):
        regions.from_box(1, (0, 0, 10, 10))
    with pytest.raises(UserInputError, match="out of range"):
        regions.from_box(-1, (0, 0, 10, 10))
    with pytest.raises(UserInputError, match="threshold"):
        regions.from_box(0, (0, 0, 10, 10), threshold=1.5)
    with pytest.raises(UserInputError, match="shape"):
        regions.from_mask(0, torch.ones(90, 50, dtype=torch.bool))
    with pytest.raises(UserInputError, match="empty"):
        regions.from_mask(0, torch.zeros(50, 90, dtype=torch.bool))
    with pytest.raises(UserInputError, match="other than 0 and 1"):
        regions.from_mask(0, torch.full((50, 90), 0.5))
    with pytest.raises(UserInputError, match="outside"):
        regions.from_points(0, [[91, 3]])
    with pytest.raises(UserInputError, match="no spatial token"):
        regions.token_box(0, int(regions.final[0]))
    with pytest.raises(UserInputError, match="buffer width"):
        regions.from_box(0, (0, 0, 10, 10)).buffer(-1)


def test_inputs_without_sizes_say_how_to_get_them(qwen):
    """Processor output passed straight to the model carries no original size for Qwen."""
    prepared = qwen.prepare(images=[random_image(90, 50, 1)], prompts=["red"])
    bare = qwen.coerce_inputs(prepared.to_hf_kwargs())
    with pytest.raises(UserInputError, match="model.prepare"):
        bare.regions.from_box(0, (0, 0, 10, 10))


def test_figure_draws_each_selected_token_with_its_coverage(qwen):
    """One panel per view; one filled rectangle per selected token at its pixel box, opacity
    0.15 + 0.6 x coverage, and the selecting box outlined."""
    pytest.importorskip("plotly")
    image = random_image(150, 70, 2)
    inputs = qwen.prepare(images=[image], prompts=["red"])
    selection = inputs.regions.from_box(0, (10, 10, 80, 60))
    figure = selection.plot(image)
    filled = [s for s in figure.layout.shapes if s.fillcolor is not None]
    assert len(filled) == len(selection)
    for shape, box, cover in zip(filled, selection.boxes.tolist(), selection.coverage.tolist(), strict=True):
        assert (shape.x0, shape.y0, shape.x1, shape.y1) == pytest.approx(tuple(box))
        assert shape.opacity == pytest.approx(0.15 + 0.6 * cover)
    outline = [s for s in figure.layout.shapes if s.fillcolor is None]
    assert [(s.x0, s.y0, s.x1, s.y1) for s in outline] == [(10, 10, 80, 60)]
    with pytest.raises(UserInputError, match="original"):
        selection.plot(random_image(10, 10, 0))


def test_figure_has_a_panel_per_view():
    pytest.importorskip("plotly")
    model = tiny_vlm("llava_next")
    image = random_image(90, 50, 1)
    inputs = model.prepare(images=[image], prompts=["red"])
    figure = inputs.regions.from_box(0, (20, 10, 61, 37)).buffer(1).plot(image)
    assert [a.text for a in figure.layout.annotations] == ["whole-image view", "tiles"]

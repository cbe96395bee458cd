"""Box -> token maps on every family, against the processor's own pixels: a red box painted on a grey
image of an odd size (wide, tall, tiny, larger than the max pixels) goes through the family's real
image processor; each token's share of red pixels in what the processor put in it (read from
pixel_values by the family's layout alone, `token_pixel_blocks`) equals the coverage vlens computes
from its geometry, on every view (base view, tiles, thumbnail). Plus the sums every view must satisfy
and OneVision's downscaled grid by hand."""

from __future__ import annotations

import pytest
import torch
from PIL import Image, ImageDraw

from tests.helpers.models import tiny_vlm
from tests.helpers.region_geometry import token_pixel_blocks
from vlens.core.image_regions import box_coverage

FAMILIES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_5", "llava", "llava_next", "llava_onevision", "gemma3",
            "internvl", "idefics3", "smolvlm", "glm4v", "aya_vision", "lfm2_vl", "molmo2", "llama4",
            "phi4_multimodal")
# (width, height, box): wide, tall, tiny (upscaled), larger than every tiny processor's max pixels
CASES = [(90, 50, (20, 10, 61, 37)), (41, 170, (5, 60, 30, 140)), (13, 9, (3, 2, 9, 7)),
         (600, 380, (100, 50, 333, 290))]
# a token's red share is read on pixels of 8 to 28 processor px per side: resampling blurs about one
# pixel at each edge of the box, so the share may differ by up to ~0.15; a token off by one cell, 1.0
TOLERANCE = 0.2


def painted(width: int, height: int, box) -> Image.Image:
    image = Image.new("RGB", (width, height), (128, 128, 128))
    ImageDraw.Draw(image).rectangle([box[0], box[1], box[2] - 1, box[3] - 1], fill=(255, 0, 0))  # pixels [x0, x1)
    return image


@pytest.mark.parametrize("family", FAMILIES)
def test_painted_box_is_where_the_tokens_say(family):
    model = tiny_vlm(family)
    for width, height, box in CASES:
        if family == "llava_onevision" and width * height > 100_000:
            continue  # a downscaled anyres grid mixes cells: checked by hand below
        inputs = model.prepare(images=[painted(width, height, box)], prompts=["red"])
        geometry = inputs.regions.image_geometry(0)
        coverage = box_coverage(geometry, box)
        blocks = token_pixel_blocks(model, inputs, 0)
        assert sorted(blocks) == sorted(geometry.positions.tolist())  # every spatial token, every view
        selected = set(inputs.regions.from_box(0, box).positions.tolist())
        for position, cover, label in zip(geometry.positions.tolist(), coverage.tolist(), geometry.labels, strict=True):
            block = blocks[position]
            red = float(((block[0] - block[1]) > 64).double().mean())
            assert abs(red - cover) <= TOLERANCE, (family, (width, height), label, red, cover)
            if red > TOLERANCE:
                assert position in selected, (family, (width, height), label)


@pytest.mark.parametrize("family", FAMILIES)
def test_each_view_tiles_the_image(family):
    """Per view (whole-image view, the tiles together), the visible parts of the tokens' cells cover
    the part of the image the processor keeps, each pixel once: sum of coverage x area = the box's
    area kept (the whole box, except where LLaVA-1.5's centre crop or anyres unpadding, which truncates
    to whole token rows / columns, drops pixels at the edge)."""
    model = tiny_vlm(family)
    for width, height, box in CASES:
        inputs = model.prepare(images=[painted(width, height, box)], prompts=["red"])
        geometry = inputs.regions.image_geometry(0)
        coverage = box_coverage(geometry, box)
        for view in geometry.view.unique().tolist():
            at = geometry.view == view
            covered = float((coverage[at] * geometry.areas[at]).sum())
            clipped = geometry.clipped[at]
            kept = (max(box[0], float(clipped[:, 0].min())), max(box[1], float(clipped[:, 1].min())),
                    min(box[2], float(clipped[:, 2].max())), min(box[3], float(clipped[:, 3].max())))
            expected = max(kept[2] - kept[0], 0) * max(kept[3] - kept[1], 0)
            assert covered == pytest.approx(expected, rel=1e-9, abs=1e-9), (family, (width, height), view)
            if not family.startswith("llava"):  # LLaVA's crop and anyres unpadding drop edge pixels
                assert kept == pytest.approx(box)


def test_onevision_downscaled_grid_by_hand():
    """600 x 380 on LLaVA-OneVision (anyres_max_4): the unpadded grid is downscaled (bilinear) to
    out_h x out_w cells, each spanning kept / out cells of the canvas: equal cells, one per output token,
    covering the image's width."""
    model = tiny_vlm("llava_onevision")
    inputs = model.prepare(images=[painted(600, 380, (100, 50, 333, 290))], prompts=["red"])
    geometry = inputs.regions.image_geometry(0)
    tiles = geometry.view == 1
    newlines = inputs.regions.tile_positions(0, "newline")
    out_h = len(newlines)
    out_w = int(tiles.sum()) // out_h
    boxes = geometry.boxes[tiles]
    ys, xs = boxes[:, 1].unique(), boxes[:, 0].unique()
    assert (len(ys), len(xs)) == (out_h, out_w)
    # the downscaled cells divide the kept canvas span evenly: equal heights, equal widths
    heights, widths = boxes[:, 3] - boxes[:, 1], boxes[:, 2] - boxes[:, 0]
    torch.testing.assert_close(heights, torch.full_like(heights, float(heights[0])))
    torch.testing.assert_close(widths, torch.full_like(widths, float(widths[0])))
    assert float(boxes[:, 0].min()) <= 0 and float(boxes[:, 2].max()) >= 600


@pytest.mark.parametrize("width,height", [(120, 40), (37, 150)])
def test_gemma3_pan_and_scan_crops_are_views_of_the_image(width, height):
    """With pan-and-scan, each crop the processor adds is a view of the original image: from_box on the
    image selects tokens of the whole view and of every crop, each at the share of its pixels the box
    covers (read from the crop's own pixel_values)."""
    model = tiny_vlm("gemma3", processor={"pan_and_scan": True})
    box = (width // 5, height // 4, width - width // 3, height - height // 5)
    inputs = model.prepare(images=[painted(width, height, box)], prompts=["red"])
    n_views = len(inputs.regions.images[0])
    assert n_views == 4  # the image + 3 crops along its long side
    geometry = inputs.regions.image_geometry(0)
    assert inputs.regions.image_geometry(2) is geometry  # every crop's index gives the whole image's views
    coverage = box_coverage(geometry, box)
    blocks = {}
    for view in range(n_views):
        blocks.update(token_pixel_blocks(model, inputs, view))
    assert sorted(blocks) == sorted(geometry.positions.tolist())
    for position, cover, label in zip(geometry.positions.tolist(), coverage.tolist(), geometry.labels, strict=True):
        block = blocks[position]
        red = float(((block[0] - block[1]) > 64).double().mean())
        assert abs(red - cover) <= TOLERANCE, ((width, height), label, red, cover)
    assert {label.split("[")[0] for label in geometry.labels} == {"img0", "img0.crop0", "img0.crop1", "img0.crop2"}

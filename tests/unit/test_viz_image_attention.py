"""Attention over the image: extraction from patterns, PIL overlays, tiled grids, plotly overlay."""

import io

import numpy as np
import pytest
import torch
from PIL import Image

from vlens.viz.colormaps import apply_colormap
from vlens.viz.image_attention import (
    attention_grid_image,
    attention_overlay_figure,
    attention_to_image,
    overlay_attention,
)

GRID = (2, 3)  # rows, cols of merged patches
IMAGE_SIZE = (60, 40)  # width, height: cells are 20 x 20 pixels
GREY = (100, 100, 100)


def cell_centre(row: int, col: int) -> tuple[int, int]:
    return col * 20 + 10, row * 20 + 10


def test_attention_to_image_picks_query_row_and_image_keys():
    n_heads, n_pos = 2, 8
    pattern = torch.zeros(n_heads, n_pos, n_pos)
    image_positions = torch.tensor([2, 3, 4])
    pattern[0, 7, 2:5] = torch.tensor([0.1, 0.2, 0.3])
    pattern[1, 7, 2:5] = torch.tensor([0.0, 0.5, 0.0])
    pattern[:, 7, 0] = 0.4  # attention off the image must not appear
    picked = attention_to_image(pattern, query_pos=-1, image_positions=image_positions)
    assert picked.shape == (n_heads, 3)
    torch.testing.assert_close(picked[0], torch.tensor([0.1, 0.2, 0.3]))
    renormalised = attention_to_image(pattern, 7, image_positions, renormalize=True)
    torch.testing.assert_close(renormalised.sum(dim=-1), torch.ones(n_heads))
    torch.testing.assert_close(renormalised[0], torch.tensor([1 / 6, 2 / 6, 3 / 6]))


def test_attention_to_image_batched_with_per_row_positions_and_queries():
    pattern = torch.rand(2, 3, 6, 6)
    rows = [torch.tensor([1, 2]), torch.tensor([3, 4])]
    picked = attention_to_image(pattern, query_pos=[5, 4], image_positions=rows)
    assert picked.shape == (2, 3, 2)
    torch.testing.assert_close(picked[1], pattern[1, :, 4, 3:5])
    shared = attention_to_image(pattern, 5, [1, 2])
    torch.testing.assert_close(shared[0], pattern[0, :, 5, 1:3])


def test_attention_to_image_rejects_bad_positions():
    pattern = torch.rand(2, 4, 4)
    with pytest.raises(IndexError, match="image_positions"):
        attention_to_image(pattern, 0, torch.tensor([3, 4]))
    with pytest.raises(IndexError, match="query_pos"):
        attention_to_image(pattern, 9, torch.tensor([1, 2]))
    with pytest.raises(ValueError, match="3-D or 4-D"):
        attention_to_image(torch.rand(4, 4), 0, torch.tensor([1]))


def test_overlay_puts_the_hottest_colour_on_the_attended_cell():
    image = Image.new("RGB", IMAGE_SIZE, GREY)
    weights = torch.zeros(6)
    weights[1 * 3 + 2] = 1.0  # row 1, col 2
    alpha = 0.5
    out = overlay_attention(image, weights, GRID, colormap="inferno", alpha=alpha)
    assert out.size == IMAGE_SIZE and out.mode == "RGB"
    hot, cold = apply_colormap(np.array([1.0, 0.0]), "inferno").astype(float)
    expected_hot = tuple(np.round(alpha * hot + (1 - alpha) * np.array(GREY)).astype(int))
    expected_cold = tuple(np.round(alpha * cold + (1 - alpha) * np.array(GREY)).astype(int))
    assert out.getpixel(cell_centre(1, 2)) == expected_hot
    for row, col in [(0, 0), (0, 2), (1, 1)]:
        assert out.getpixel(cell_centre(row, col)) == expected_cold
    # The hot block covers exactly its cell: the neighbouring pixel column is cold.
    assert out.getpixel((39, 30)) == expected_cold and out.getpixel((40, 30)) == expected_hot
    buffer = io.BytesIO()
    out.save(buffer, format="PNG")
    assert buffer.getvalue().startswith(b"\x89PNG")


def test_overlay_smooth_and_input_errors():
    image = Image.new("L", (33, 17))
    smooth = overlay_attention(image, torch.arange(6.0), GRID, smooth=True)
    assert smooth.size == (33, 17) and smooth.mode == "RGB"
    with pytest.raises(ValueError, match="6 cells"):
        overlay_attention(image, torch.ones(5), GRID)
    with pytest.raises(TypeError, match="PIL image"):
        overlay_attention(np.zeros((4, 4)), torch.ones(6), GRID)


def test_attention_grid_image_tiles_one_overlay_per_map():
    image = Image.new("RGB", IMAGE_SIZE, GREY)
    maps = torch.eye(6)[:5]  # map i puts all mass on cell i
    tiled = attention_grid_image(
        image, maps, GRID, titles=[f"L0H{i}" for i in range(5)], n_cols=3, tile_size=60
    )
    tile_w, tile_h, caption, gap = 60, 40, 16, 4
    assert tiled.size == (3 * (tile_w + gap) + gap, 2 * (tile_h + caption + gap) + gap)
    hot = tuple(int(v) for v in tiled.getpixel((gap + 10, gap + caption + 10)))  # tile 0, cell (0, 0)
    cold = tiled.getpixel((gap + 30, gap + caption + 10))  # tile 0, cell (0, 1)
    assert sum(hot) > sum(cold)
    with pytest.raises(ValueError, match="titles"):
        attention_grid_image(image, maps, GRID, titles=["only one"])


def test_attention_overlay_figure_has_image_and_grid_heatmap():
    image = Image.new("RGB", IMAGE_SIZE, GREY)
    figure = attention_overlay_figure(image, torch.arange(6.0), GRID, title="L19H23")
    kinds = [trace.type for trace in figure.data]
    assert kinds == ["image", "heatmap"]
    heatmap = figure.data[1]
    assert np.asarray(heatmap.z).shape == GRID
    assert heatmap.z[1][2] == 5.0 and heatmap.dx == 20 and heatmap.dy == 20
    assert figure.data[0].source.startswith("data:image/png;base64,")

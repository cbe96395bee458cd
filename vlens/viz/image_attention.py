"""Attention over the image: pick image-token attention out of a pattern and draw it on the picture.

Image tokens are the merged-patch tokens of one image, in row-major order over the merged grid
`(rows, cols)` (`inputs.regions.image_grid`), so weight `k` belongs to cell `(k // cols, k % cols)`.
"""

from __future__ import annotations

import base64
import io
from collections.abc import Sequence

import numpy as np
import torch
from jaxtyping import Float, Int
from PIL import Image, ImageDraw
from torch import Tensor

from vlens.utils.errors import UserInputError
from vlens.viz.checks import as_float_tensor, as_grid
from vlens.viz.colormaps import PLOTLY_NAMES, apply_colormap
from vlens.viz.optional import require_make_subplots, require_plotly


def attention_to_image(
    pattern: Float[Tensor, "n_heads q k"] | Float[Tensor, "batch n_heads q k"],
    query_pos: int | Sequence[int] | Tensor,
    image_positions: Int[Tensor, " n_image_tokens"] | Sequence[Int[Tensor, " n_image_tokens"]],
    renormalize: bool = False,
) -> Float[Tensor, "n_heads n_image_tokens"] | Float[Tensor, "batch n_heads n_image_tokens"]:
    """Attention from one query position to the image-token positions.

    Args:
        pattern: attention pattern (`hook_pattern`), with or without the batch dimension.
        query_pos: the query position (negative counts from the end); with a batch, one int for
            every row or one int per row.
        image_positions: key positions of the image tokens; with a batch, one shared 1-D tensor or
            one per row (all of the same length, e.g. same-size images).
        renormalize: divide by the total attention on the image so each row sums to 1
            (rows with no attention on the image stay zero).

    Returns:
        `[n_heads, n_image_tokens]`, or `[batch, n_heads, n_image_tokens]` for a batched pattern.
    """
    pattern = as_float_tensor(pattern, "pattern", (3, 4))
    batched = pattern.ndim == 4
    rows = pattern if batched else pattern.unsqueeze(0)
    batch, _, n_queries, n_keys = rows.shape

    queries = torch.as_tensor(query_pos).long().flatten()
    if queries.numel() == 1:
        queries = queries.expand(batch)
    if queries.numel() != batch:
        raise UserInputError(f"query_pos has {queries.numel()} entries for a batch of {batch}")
    if ((queries >= n_queries) | (queries < -n_queries)).any():
        raise IndexError(f"query_pos {queries.tolist()} out of range for {n_queries} query positions")
    queries = queries % n_queries

    keys = _positions_per_row(image_positions, batch)
    if ((keys < 0) | (keys >= n_keys)).any():
        raise IndexError(f"image_positions must lie in [0, {n_keys}) (the key positions of the pattern)")

    picked = torch.stack([rows[b, :, queries[b], keys[b]] for b in range(batch)])  # [batch, heads, n_img]
    if renormalize:
        total = picked.sum(dim=-1, keepdim=True)
        picked = torch.where(total > 0, picked / total.clamp_min(torch.finfo(picked.dtype).tiny), picked)
    return picked if batched else picked[0]


def _positions_per_row(image_positions, batch: int) -> Int[Tensor, "batch n_image_tokens"]:
    """One row of image-token positions per batch row (a shared 1-D set is repeated)."""
    if isinstance(image_positions, Tensor):
        per_row = [image_positions] if image_positions.ndim == 1 else list(image_positions)
    elif all(isinstance(p, int) for p in image_positions):
        per_row = [torch.tensor(list(image_positions))]
    else:
        per_row = [torch.as_tensor(p).flatten() for p in image_positions]
    if len(per_row) == 1:
        per_row = per_row * batch
    if len(per_row) != batch:
        raise UserInputError(f"image_positions has {len(per_row)} rows for a batch of {batch}")
    if len({p.numel() for p in per_row}) != 1:
        raise UserInputError("every batch row needs the same number of image positions (same-size images)")
    return torch.stack([p.long() for p in per_row])


def _weights_on_grid(weights, grid) -> tuple[np.ndarray, int, int]:
    rows, cols = as_grid(grid)
    values = as_float_tensor(weights, "weights", (1, 2))
    if values.numel() != rows * cols:
        raise UserInputError(
            f"weights has {values.numel()} entries but the grid {rows}x{cols} has {rows * cols} cells"
        )
    return values.reshape(rows, cols).numpy(), rows, cols


def _scale_to_unit(values: np.ndarray, vmin: float | None, vmax: float | None) -> np.ndarray:
    low = float(values.min()) if vmin is None else vmin
    high = float(values.max()) if vmax is None else vmax
    if high <= low:  # a constant map: draw it at the bottom of the colormap
        return np.zeros_like(values)
    return (values - low) / (high - low)


def overlay_attention(
    image: Image.Image,
    weights: Float[Tensor, " n_image_tokens"],
    grid: tuple[int, int],
    colormap: str = "inferno",
    alpha: float = 0.6,
    smooth: bool = False,
    vmin: float | None = None,
    vmax: float | None = None,
) -> Image.Image:
    """Draw attention weights over the image as a colour heatmap.

    Args:
        image: the input picture (any mode; any size: the grid is stretched over it).
        weights: one weight per merged-patch token, row-major over `grid`.
        grid: `(rows, cols)` of the merged patch grid.
        colormap: one of `vlens.viz.colormaps.colormap_names()`.
        alpha: heatmap opacity in [0, 1].
        smooth: bilinear upsampling instead of one flat block per patch.
        vmin, vmax: value range of the colormap (default: the map's own min and max).

    Returns:
        An RGB image of the same size as `image`.
    """
    if not isinstance(image, Image.Image):
        raise TypeError(f"image must be a PIL image, got {type(image).__name__}")
    if not 0.0 <= alpha <= 1.0:
        raise UserInputError(f"alpha must be in [0, 1], got {alpha}")
    values, _, _ = _weights_on_grid(weights, grid)
    unit = _scale_to_unit(values, vmin, vmax)
    # Upsample the scalar map (not the colours) so smoothing stays on the colormap.
    small = Image.fromarray(unit.astype(np.float32), mode="F")
    resample = Image.Resampling.BILINEAR if smooth else Image.Resampling.NEAREST
    upsampled = np.asarray(small.resize(image.size, resample=resample))
    heat = apply_colormap(upsampled, colormap).astype(np.float32)
    base = np.asarray(image.convert("RGB"), dtype=np.float32)
    blended = (1.0 - alpha) * base + alpha * heat
    return Image.fromarray(blended.round().clip(0, 255).astype(np.uint8), mode="RGB")


def attention_grid_image(
    image: Image.Image,
    maps: Float[Tensor, "n_maps n_image_tokens"],
    grid: tuple[int, int],
    titles: Sequence[str] | None = None,
    n_cols: int = 4,
    tile_size: int = 224,
    shared_scale: bool = False,
    colormap: str = "inferno",
    alpha: float = 0.6,
) -> Image.Image:
    """Several attention maps (heads / layers) over the same image, tiled into one picture.

    Args:
        maps: one row of image-token weights per tile.
        titles: one caption per tile (e.g. "L19H23"); default "map 0", "map 1", ...
        n_cols: tiles per row.
        tile_size: longest side of each tile in pixels (the image is shrunk, keeping its aspect).
        shared_scale: one colour scale for all tiles (compare magnitudes) instead of one per tile.

    Returns:
        One RGB image, PNG-saveable, with a caption strip above each tile.
    """
    maps = as_float_tensor(maps, "maps", 2)
    n_maps = maps.shape[0]
    if n_maps == 0:
        raise UserInputError("maps is empty: pass at least one [rows, cols] map")
    if titles is None:
        titles = [f"map {i}" for i in range(n_maps)]
    if len(titles) != n_maps:
        raise UserInputError(f"{len(titles)} titles for {n_maps} maps")
    if n_cols < 1 or tile_size < 8:
        raise UserInputError("n_cols must be >= 1 and tile_size >= 8")

    scale = tile_size / max(image.size)
    tile_w, tile_h = max(1, round(image.width * scale)), max(1, round(image.height * scale))
    small = image.convert("RGB").resize((tile_w, tile_h), Image.Resampling.BILINEAR)
    vmin, vmax = (float(maps.min()), float(maps.max())) if shared_scale else (None, None)

    caption_h, gap = 16, 4
    n_rows = -(-n_maps // n_cols)
    columns = min(n_cols, n_maps)
    canvas = Image.new(
        "RGB", (columns * (tile_w + gap) + gap, n_rows * (tile_h + caption_h + gap) + gap), "white"
    )
    draw = ImageDraw.Draw(canvas)
    for index, (weights, title) in enumerate(zip(maps, titles, strict=True)):
        left = gap + (index % n_cols) * (tile_w + gap)
        top = gap + (index // n_cols) * (tile_h + caption_h + gap)
        draw.text((left + 2, top + 2), str(title), fill="black")
        tile = overlay_attention(small, weights, grid, colormap=colormap, alpha=alpha, vmin=vmin, vmax=vmax)
        canvas.paste(tile, (left, top + caption_h))
    return canvas


def image_to_data_uri(image: Image.Image) -> str:
    """A PIL image as a `data:image/png;base64,...` URI (offline-safe HTML and plotly sources)."""
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def attention_overlay_figure(
    image: Image.Image,
    weights: Float[Tensor, " n_image_tokens"],
    grid: tuple[int, int],
    title: str = "",
    colormap: str = "inferno",
    opacity: float = 0.55,
    value_label: str = "attention",
):
    """Interactive version of `overlay_attention`: the image as background, a heatmap on top.

    Hovering a cell shows its grid row/column, token index and weight.

    Returns:
        `plotly.graph_objects.Figure` with one `Image` and one `Heatmap` trace (z: `[rows, cols]`).
    """
    go = require_plotly()
    if not isinstance(image, Image.Image):
        raise TypeError(f"image must be a PIL image, got {type(image).__name__}")
    values, rows, cols = _weights_on_grid(weights, grid)
    cell_w, cell_h = image.width / cols, image.height / rows
    token_index = np.arange(rows * cols).reshape(rows, cols)
    row_index, col_index = np.divmod(token_index, cols)
    figure = go.Figure()
    figure.add_trace(go.Image(source=image_to_data_uri(image.convert("RGB")), hoverinfo="skip"))
    figure.add_trace(
        go.Heatmap(
            z=values,
            x0=cell_w / 2,
            dx=cell_w,
            y0=cell_h / 2,
            dy=cell_h,
            opacity=opacity,
            colorscale=PLOTLY_NAMES.get(colormap, colormap),
            colorbar={"title": {"text": value_label}},
            customdata=np.stack([row_index, col_index, token_index], axis=-1),
            hovertemplate=(
                "row %{customdata[0]}, col %{customdata[1]} (token %{customdata[2]})"
                f"<br>{value_label}: %{{z:.4g}}<extra></extra>"
            ),
        )
    )
    figure.update_layout(title=title, xaxis={"visible": False}, yaxis={"visible": False, "scaleanchor": "x"})
    return figure


def attention_tiles_figure(
    image: Image.Image,
    maps: Float[Tensor, "n_maps n_image_tokens"],
    grid: tuple[int, int],
    titles: Sequence[str] | None = None,
    n_cols: int = 8,
    tile_size: int = 112,
    colormap: str = "inferno",
    opacity: float = 0.6,
    value_label: str = "attention",
    signed: bool = False,
):
    """Several attention maps over the same image, one panel each, on ONE shared colour scale.

    Tiles are compared with each other, so every heatmap uses the figure's single `coloraxis`
    (0 to the largest weight of any tile) and one colour bar; a faint map is faint.

    Args:
        maps: one row of image-token weights per tile (row-major over `grid`).
        titles: one caption per tile (e.g. "L2H7"); default "map 0", "map 1", ...
        n_cols: tiles per row; tile_size: the picture's longest side in each tile (pixels).
        signed: maps of signed scores (attributions): a diverging colour scale symmetric about 0
            (-m to m, m the largest |value| of any tile; `colormap` is then ignored).

    Returns:
        A Figure with one `Image` + one `Heatmap` trace per tile, all heatmaps on `coloraxis`.
    """
    go = require_plotly()
    make_subplots = require_make_subplots()
    if not isinstance(image, Image.Image):
        raise TypeError(f"image must be a PIL image, got {type(image).__name__}")
    maps = as_float_tensor(maps, "maps", 2)
    n_maps = maps.shape[0]
    if n_maps == 0:
        raise UserInputError("maps is empty: pass at least one [rows, cols] map")
    titles = [f"map {i}" for i in range(n_maps)] if titles is None else [str(t) for t in titles]
    if len(titles) != n_maps:
        raise UserInputError(f"{len(titles)} titles for {n_maps} maps")
    if n_cols < 1 or tile_size < 8:
        raise UserInputError("n_cols must be >= 1 and tile_size >= 8")
    columns = min(n_cols, n_maps)
    n_rows = -(-n_maps // columns)
    scale = tile_size / max(image.size)
    small = image.convert("RGB").resize((max(1, round(image.width * scale)), max(1, round(image.height * scale))),
                                        Image.Resampling.BILINEAR)
    source = image_to_data_uri(small)
    rows, cols = as_grid(grid)
    cell_w, cell_h = small.width / cols, small.height / rows
    figure = make_subplots(rows=n_rows, cols=columns, subplot_titles=titles, horizontal_spacing=0.02,
                           vertical_spacing=0.12 / n_rows)
    for index, weights in enumerate(maps):
        values, _, _ = _weights_on_grid(weights, grid)
        row, col = index // columns + 1, index % columns + 1
        figure.add_trace(go.Image(source=source, hoverinfo="skip"), row=row, col=col)
        figure.add_trace(go.Heatmap(z=values, x0=cell_w / 2, dx=cell_w, y0=cell_h / 2, dy=cell_h, opacity=opacity,
                                    coloraxis="coloraxis", name=titles[index],
                                    hovertemplate=f"{titles[index]}<br>{value_label}: %{{z:{'.4g' if signed else '.3f'}}}"
                                                  "<extra></extra>"),
                         row=row, col=col)
    figure.update_xaxes(visible=False)
    figure.update_yaxes(visible=False)
    figure.update_annotations(font_size=11)
    top = float(maps.abs().max()) if signed else float(maps.max())
    top = top if top > 0 else 1.0
    colorscale = "RdBu_r" if signed else PLOTLY_NAMES.get(colormap, colormap)
    figure.update_layout(
        coloraxis={"colorscale": colorscale, "cmin": -top if signed else 0.0, "cmax": top,
                   "colorbar": {"title": {"text": f"{value_label}<br>(shared)"}, "thickness": 14}},
        height=max(260, 150 * n_rows + 80), margin={"t": 60, "l": 10, "r": 10, "b": 10},
    )
    return figure

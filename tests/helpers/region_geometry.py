"""Hand-computed preprocessing geometry shared by the tests of image regions and L_focus centres."""

from __future__ import annotations

import math

import torch
from transformers.image_processing_utils import select_best_resolution


def smart_resize_by_hand(height: int, width: int, factor: int = 28, min_pixels: int = 56 * 56,
                         max_pixels: int = 28 * 28 * 64) -> tuple[int, int]:
    """Qwen-VL's smart_resize, written out: (height, width) rounded to multiples of `factor`, scaled to
    stay within [min_pixels, max_pixels]."""
    h, w = round(height / factor) * factor, round(width / factor) * factor
    if h * w > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h, w = math.floor(height / beta / factor) * factor, math.floor(width / beta / factor) * factor
    elif h * w < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h, w = math.ceil(height * beta / factor) * factor, math.ceil(width * beta / factor) * factor
    return h, w


def token_pixel_blocks(model, inputs, image_index: int) -> dict[int, torch.Tensor]:
    """What the processor put in each spatial token of one image, read from `inputs.pixel_values`
    by the family's pixel layout alone (not by vlens's boxes): {position: [3, h, w] pixels in 0..255}.

    Qwen: pixel_values holds each image's patches in merged-token order (merge_size ** 2 patches of
    [C, T, P, P] per token); LLaVA, Gemma 3, InternVL: [entries, C, S, S] (InternVL: an image's tiles,
    thumbnail last); LLaVA-NeXT / OneVision: [images, tiles, C, S, S], a tile record's cells start at
    the rows / columns unpadding kept; Idefics3: [rows, sub-images, C, S, S], a row's images in order.
    """
    regions = inputs.regions
    slots = [(row, image) for row in range(len(regions.images)) for image in range(len(regions.images[row]))]
    row, image = slots[image_index]
    image_processor = getattr(model.processor, "image_processor", model.processor)
    mean = torch.tensor(image_processor.image_mean, dtype=torch.float64)[:, None, None]
    std = torch.tensor(image_processor.image_std, dtype=torch.float64)[:, None, None]
    pixels = inputs.pixel_values.cpu().to(torch.float64)
    records = [r for r in regions.tiles[row][image] if r.spatial]
    out: dict[int, torch.Tensor] = {}
    if pixels.ndim == 3:  # patchified tiles [entries, patches, p * p * 3] (LFM2-VL, Molmo 2)
        blocks = _patchified_blocks(model, inputs, image_index, row, image, records, pixels)
        return {k: v * std * 255 + mean * 255 for k, v in blocks.items()}
    if pixels.ndim == 2:  # Qwen: patches in merged-token order
        thw = inputs.image_grid_thw.cpu()
        offset = int(sum(int(t * h * w) for t, h, w in thw[:image_index].tolist()))
        merge = int(image_processor.merge_size)
        patch, temporal = int(image_processor.patch_size), int(image_processor.temporal_patch_size)
        for k, position in enumerate(regions.images[row][image].tolist()):
            block = pixels[offset + k * merge**2: offset + (k + 1) * merge**2].reshape(merge**2, 3, temporal, patch, patch)
            out[position] = torch.cat(list(block[:, :, 0]), dim=-1) * std * 255 + mean * 255
        return out
    if pixels.ndim == 4:  # one entry per image (LLaVA, Gemma 3) or per tile (InternVL)
        entries = inputs.pixel_entries or [1] * (sum(len(r) for r in regions.images))
        first = sum(entries[:image_index])
        views = [pixels[first + k] for k in range(entries[image_index])]
    else:
        if model.adapter.family in ("idefics3", "smolvlm", "idefics2"):
            first = sum(sum(1 for r in records_ if r.kind in ("tile", "base", "image"))
                        for records_ in regions.tiles[row][:image])
            views = list(pixels[row, first:])
        else:
            views = list(pixels[image_index])
    for record in records:
        view = views[record.index] * std * 255 + mean * 255
        side = view.shape[-1]
        rows, cols = record.grid
        r0 = c0 = 0
        cell = side // rows if record.kind != "tile" or record.layout is None or model.adapter.family not in (
            "llava_next", "llava_onevision") else None
        if cell is None:  # an anyres tile: cells of side / g px, from the rows / columns unpadding kept
            g = model.adapter.geometry().side
            cell = side // g
            size = model.adapter.image_sizes(inputs)[image_index]
            best_h, best_w = select_best_resolution(size, model.adapter.geometry().pinpoints)
            tile_side = model.adapter.geometry().tile_side
            newlines = regions.tile_positions(row, "newline")
            image_newlines = [p for p in newlines.tolist() if p in set(regions.images[row][image].tolist())]
            out_h = len(image_newlines)
            tiles = [r for r in records if r.kind == "tile"]
            out_w = sum(len(r.positions) for r in tiles) // max(out_h, 1)
            row0 = (best_h // tile_side * g - out_h) // 2
            col0 = (best_w // tile_side * g - out_w) // 2
            r0 = max(row0 - record.layout[0] * g, 0)
            c0 = max(col0 - record.layout[1] * g, 0)
        for k, position in enumerate(record.positions.tolist()):
            r, c = divmod(k, cols)
            out[position] = view[:, (r0 + r) * cell:(r0 + r + 1) * cell, (c0 + c) * cell:(c0 + c + 1) * cell]
    return out


def _patches_to_image(patches: torch.Tensor, rows: int, cols: int, p: int) -> torch.Tensor:
    """[rows * cols, p * p * 3] patches (each row by row, channels last) -> [3, rows * p, cols * p]."""
    return patches[:rows * cols].reshape(rows, cols, p, p, 3).permute(4, 0, 2, 1, 3).reshape(3, rows * p, cols * p)


def _patchified_blocks(model, inputs, image_index: int, row: int, image: int, records, pixels) -> dict:
    """LFM2-VL: each tile's patches rebuilt into its image by `spatial_shapes`, a token's cell factor x factor
    patches of its tile. Molmo 2: each token's pixels are the patches `image_token_pooling` pools into it, laid
    out as its pool_h x pool_w window (an empty slot stays 0: not red)."""
    image_processor = getattr(model.processor, "image_processor", model.processor)
    entries = inputs.pixel_entries
    first = sum(entries[:image_index])
    out: dict[int, torch.Tensor] = {}
    if model.adapter.family == "lfm2_vl":
        p = image_processor.encoder_patch_size
        shapes = inputs.extra["spatial_shapes"].cpu().tolist()
        for record in records:
            h, w = shapes[first + record.index]
            view = _patches_to_image(pixels[first + record.index], h, w, p)
            cell_h, cell_w = view.shape[-2] // record.grid[0], view.shape[-1] // record.grid[1]
            for k, position in enumerate(record.positions.tolist()):
                r, c = divmod(k, record.grid[1])
                out[position] = view[:, r * cell_h:(r + 1) * cell_h, c * cell_w:(c + 1) * cell_w]
        return out
    # Molmo 2: the image's pooling rows, its crops' patches
    p = image_processor.patch_size
    pool_h, pool_w = image_processor.pooling_size
    counts = [len(t) for r in inputs.regions.images for t in r]
    pooling = inputs.extra["image_token_pooling"].cpu()[sum(counts[:image_index]):sum(counts[:image_index + 1])]
    patches = pixels[first:first + entries[image_index]].reshape(-1, pixels.shape[-1])
    positions = inputs.regions.images[row][image].tolist()
    for k, position in enumerate(positions):
        block = torch.full((3, pool_h * p, pool_w * p), -1.0, dtype=pixels.dtype)  # an empty slot: black, not red
        for slot, index in enumerate(pooling[k].tolist()):
            if index >= 0:
                r, c = divmod(slot, pool_w)
                block[:, r * p:(r + 1) * p, c * p:(c + 1) * p] = _patches_to_image(patches[index:index + 1], 1, 1, p)
        out[position] = block
    return out

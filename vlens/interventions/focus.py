"""The object-focused attention regulariser L_focus (docs/method.md, section 7).

A synthetic image's object centres give a soft target over the merged patch grid:

    u(p) = sum_k exp(-||p - pi(c_k)||^2 / (2 sigma^2)),   g = u / sum_p u(p)

and at target layers the head-averaged attention of a text query over the image tokens,
renormalised over those tokens (q_t^l), is pulled towards g by a cross-entropy:

    L_focus = 1/(|L||T|) * sum_l sum_t ( - sum_j g(j) log(q_t^l(j) + eps) ).

Pixel -> grid convention (pi): each family's real preprocessing, from its architecture
adapter (`adapter.image_points_to_grid`, used when `focus_prior` gets the model). Qwen's
processor resizes the *whole* image (smart_resize, no crop) to multiples of
patch_size * merge_size, so merged cell (r, c) covers the original-pixel box
[c W/cols, (c+1) W/cols) x [r H/rows, (r+1) H/rows), whatever the resize:
col = x * cols / W - 0.5,  row = y * rows / H - 0.5 (cell centres on integers, (x, y) in
original pixels, (rows, cols) from `inputs.regions.image_grid`). LLaVA-1.5's CLIP processor
resizes the shortest side and centre-crops: points go through the same resize and crop, and
objects the crop removes get no prior mass (an image whose objects are all cropped away adds
nothing to its row). Without the model, the whole-image (Qwen) map is used.

Several images in one row: every image's Gaussians are evaluated on its own grid and g is
normalised jointly over all image tokens of the row (objects in either image attract the
query). Rows without objects are left out of the batch mean.

Tiled images (LLaVA-NeXT / OneVision anyres, `inputs.regions.tiles`): the Gaussians are laid on
every spatial record of the image, the base view and each high-resolution tile, through the
pixel box each covers (sigma in that grid's own cells; a Gaussian near a tile border continues
into the neighbouring tile), and normalised jointly with the rest of the row; newline and CLS
tokens get no mass.

Compute only what is needed: `capture_patterns` hooks `blocks.{l}.attn.hook_pattern` of the
target layers only, so every other layer keeps the fast SDPA path; gradients flow through the
captured pattern.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from vlens.core.architectures.base import points_to_box_grid
from vlens.utils.errors import UserInputError

if TYPE_CHECKING:
    from vlens.core.model import HookedVLM


# Qwen2.5-VL-7B (28 layers): layer 2 and the routing layers 18-22 (docs/method.md, section 7)
PAPER_FOCUS_LAYERS: tuple[int, ...] = (2, 18, 19, 20, 21, 22)
PAPER_N_LAYERS = 28
DEFAULT_EPS = 1e-8

# (x, y) centres in original pixels, and the image's (width, height)
Centres = Sequence[Sequence[float]]
ImageObjects = tuple[Centres, tuple[int, int]]


def default_focus_layers(n_layers: int, softmax_layers: Sequence[int] | None = None) -> list[int]:
    """The paper's target layers mapped proportionally onto a model of `n_layers` layers.

    Layer l of the 28-layer model maps to round(l * (n_layers - 1) / 27); identical for 28.
    softmax_layers: the layers that have an attention pattern, where only some do (a hybrid decoder:
    Qwen3.5's linear-attention layers have none); each mapped layer moves to the nearest of them
    (the lower one on a tie).
    """
    if n_layers < 1:
        raise UserInputError(f"n_layers must be positive, got {n_layers}")
    scale = (n_layers - 1) / (PAPER_N_LAYERS - 1)
    mapped = {round(layer * scale) for layer in PAPER_FOCUS_LAYERS}
    if softmax_layers is not None:
        if not softmax_layers:
            raise UserInputError("this model has no softmax-attention layer: the focus loss needs attention patterns")
        mapped = {min(softmax_layers, key=lambda s: (abs(s - m), s)) for m in mapped}  # noqa: B023 (used at once)
    return sorted(mapped)


def model_focus_layers(model: HookedVLM) -> list[int]:
    """`default_focus_layers` for `model`, on its softmax-attention layers where it has linear ones."""
    cfg = model.cfg
    softmax = [x for x in range(cfg.n_layers) if not cfg.is_linear_attention(x)] if cfg.linear_attention_layers \
        else None
    return default_focus_layers(cfg.n_layers, softmax)


def pixel_to_grid(
    centres: Float[Tensor, "n 2"] | Centres, image_size: tuple[int, int], grid: tuple[int, int]
) -> Float[Tensor, "n 2"]:
    """Object centres (x, y) in original pixels -> (row, col) merged-grid coordinates.

    image_size: (width, height) of the original image; grid: (rows, cols) merged grid.
    Cell centres sit on integers: pixel (W / cols * (c + 0.5), H / rows * (r + 0.5)) -> (r, c).
    """
    width, height = image_size
    rows, cols = grid
    if width <= 0 or height <= 0 or rows <= 0 or cols <= 0:
        raise UserInputError(f"image size {image_size} and grid {grid} must be positive")
    xy = torch.as_tensor(centres, dtype=torch.float64).reshape(-1, 2)
    return torch.stack([xy[:, 1] * rows / height - 0.5, xy[:, 0] * cols / width - 0.5], dim=-1)


def object_prior(
    centres: Float[Tensor, "n 2"] | Centres,
    image_size: tuple[int, int],
    grid: tuple[int, int],
    sigma: float = 1.0,
    normalise: bool = True,
    to_grid: Callable | None = None,
) -> Float[Tensor, "cells"]:
    """The Gaussian prior over one image's merged cells, row-major (the image-token order).

    to_grid: ``(points [n, 2] float64, image_size, grid) -> (grid coordinates [n, 2], visible
        [n])``, the family's preprocessing (``adapter.image_points_to_grid``); default: the
        whole-image map of :func:`pixel_to_grid`. Points that are not visible are left out.
    Returns u (normalise=False) or g = u / sum(u) as float64 [rows * cols].
    """
    if sigma <= 0:
        raise UserInputError(f"sigma must be positive (grid units), got {sigma}")
    if to_grid is None:
        points = pixel_to_grid(centres, image_size, grid)  # [n, 2]
    else:
        xy = torch.as_tensor(centres, dtype=torch.float64).reshape(-1, 2)
        points, visible = to_grid(xy, image_size, grid)
        points = points[visible]
    rows, cols = grid
    r, c = torch.meshgrid(
        torch.arange(rows, dtype=torch.float64), torch.arange(cols, dtype=torch.float64), indexing="ij"
    )
    cells = torch.stack([r.flatten(), c.flatten()], dim=-1)  # [cells, 2]
    dist2 = ((cells[:, None, :] - points[None, :, :]) ** 2).sum(-1)  # [cells, n]
    u = torch.exp(-dist2 / (2 * sigma**2)).sum(-1)
    if not normalise:
        return u
    total = u.sum()
    if total <= 0:
        raise UserInputError("the prior is empty: give at least one object centre")
    return u / total


@dataclass
class FocusPrior:
    """Per batch row, the target distribution g over that row's image tokens.

    weights: [batch, seq] g on image positions (sums to 1 over a valid row), 0 elsewhere.
    image_mask: [batch, seq] True at image-token positions.
    valid: [batch] rows that have objects (the others are left out of L_focus).
    """

    weights: Float[Tensor, "batch seq"]
    image_mask: Bool[Tensor, "batch seq"]
    valid: Bool[Tensor, "batch"]

    def to(self, device) -> FocusPrior:
        return FocusPrior(self.weights.to(device), self.image_mask.to(device), self.valid.to(device))


def focus_prior(
    inputs, objects: Sequence[Sequence[ImageObjects] | None], sigma: float = 1.0, model: HookedVLM | None = None
) -> FocusPrior:
    """Build g for a batch of `VLMInputs` (with regions).

    objects: per row, per image (in prompt order), (centres [(x, y), ...] in original pixels,
        (width, height) of that image); None or [] for a row without objects. An image with no
        (visible) centres contributes nothing to its row.
    model: the HookedVLM the inputs are for: centres go through its family's preprocessing
        (resize, crop). Without it, the whole-image (Qwen) map is used.
    """
    def tile_map(tile):
        """The pixel -> grid map of one spatial tile record (None: the whole-image map)."""
        if model is not None:
            adapter, processor = model.adapter, model.processor
            return lambda points, size, grid: adapter.image_points_to_tile(processor, points, size, tile)
        if tile.box is not None:
            return lambda points, size, grid: points_to_box_grid(points, size, tile.box, grid)
        return None

    regions = inputs.regions
    if regions is None:
        raise UserInputError("focus_prior needs inputs with token regions: build them with model.prepare(...)")
    batch, seq = inputs.input_ids.shape
    if len(objects) != batch:
        raise UserInputError(
            f"got objects for {len(objects)} rows but the batch has {batch}; give one entry per row"
        )
    weights = torch.zeros(batch, seq, dtype=torch.float64)
    image_mask = torch.zeros(batch, seq, dtype=torch.bool)
    valid = torch.zeros(batch, dtype=torch.bool)
    for row in range(batch):
        image_mask[row, regions.image[row].cpu()] = True
        row_objects = objects[row] or []
        if row_objects and len(row_objects) != len(regions.images[row]):
            raise UserInputError(
                f"row {row} has {len(regions.images[row])} images but objects for {len(row_objects)}; give "
                "(centres, (width, height)) for every image of the row, in prompt order"
            )
        for image, (centres, size) in enumerate(row_objects):
            if len(centres) == 0:
                continue
            if size is None:
                raise UserInputError(f"row {row}: give each image's (width, height) with its object centres")
            # every spatial record of the image: its one grid, or an anyres image's base view and tiles
            # (CLS and newline tokens are no place on the image and get no mass)
            records = regions.tiles[row][image] if regions.tiles else [regions.image_view(row, image)]
            for tile in records:
                if tile.spatial:
                    weights[row, tile.positions.cpu()] += object_prior(centres, size, tile.grid, sigma, normalise=False,
                                                                       to_grid=tile_map(tile))
        total = weights[row].sum()
        if total > 0:
            weights[row] /= total
            valid[row] = True
    device = inputs.input_ids.device
    return FocusPrior(weights.to(device), image_mask.to(device), valid.to(device))


def objects_from_record(record: dict, image_size: tuple[int, int] | None = None) -> ImageObjects:
    """(centres, (width, height)) from a vlens.data record: the question's target objects
    (record["targets"], all objects if absent) and the record's square image size."""
    objects = record.get("objects") or []
    targets = record.get("targets")
    if targets is not None:
        wanted = set(targets)
        objects = [o for o in objects if o.get("id") in wanted]
    centres = [tuple(o["center"]) for o in objects]
    if "centres" in record and not objects:  # the zoo's dot variants store bare centres
        centres = [tuple(c) for c in record["centres"]]
    if image_size is None:
        side = record.get("image_size")
        if side is None:
            raise UserInputError("the record has no image_size: pass image_size=(width, height)")
        image_size = (int(side), int(side))
    return centres, image_size


def query_index(query_positions: Int[Tensor, "batch"] | Int[Tensor, "batch t"]) -> Int[Tensor, "batch t"]:
    positions = torch.as_tensor(query_positions, dtype=torch.long)
    return positions.unsqueeze(-1) if positions.ndim == 1 else positions


def focus_loss(
    patterns: dict[int, Float[Tensor, "batch t heads key"]],
    prior: FocusPrior,
    eps: float = DEFAULT_EPS,
) -> Float[Tensor, ""]:
    """L_focus from the attention rows of the query tokens at each target layer.

    patterns: layer -> attention probabilities of the T query tokens, [batch, T, heads, key]
        (what `capture_patterns` stores). Heads are averaged, the result renormalised over the
        image tokens, then cross-entropy with g; mean over layers and query tokens, then over
        the valid rows. A query token that reads no image token at that layer (outside a sliding
        window) is left out of the means. Returns a 0-d float32 tensor (0 when no row has objects).
    """
    if not patterns:
        raise UserInputError("no attention patterns captured: is any target layer hooked?")
    if not bool(prior.valid.any()):
        first = next(iter(patterns.values()))
        return first.sum() * 0.0
    per_row, seen_rows = [], []
    for rows in patterns.values():
        attn = rows.float().mean(dim=2)  # [batch, T, key]
        mask = prior.image_mask[:, None, :].to(attn.device)
        on_image = attn * mask
        mass = on_image.sum(-1, keepdim=True)
        # a query that reads no image token (a sliding-window layer whose window ends before the image)
        # has nothing to focus: left out, with a finite gradient (no division by zero mass)
        sees = mass[..., 0] > 0  # [batch, T]
        q = on_image / torch.where(mass > 0, mass, torch.ones_like(mass))
        g = prior.weights[:, None, :].to(attn.device, torch.float32)
        cross_entropy = torch.where(sees, -(g * torch.log(q + eps)).sum(-1), 0.0)  # [batch, T]
        count = sees.sum(-1)
        per_row.append(cross_entropy.sum(-1) / count.clamp_min(1))  # mean over the query tokens that see images
        seen_rows.append(count > 0)
    seen = torch.stack(seen_rows)  # [layers, batch]
    loss = torch.stack(per_row).sum(0) / seen.sum(0).clamp_min(1)  # mean over layers -> [batch]
    valid = prior.valid.to(loss.device) & seen.any(0)
    if not bool(valid.any()):
        return loss.sum() * 0.0
    return loss[valid].mean()


@contextmanager
def capture_patterns(
    model: HookedVLM, layers: Sequence[int], query_positions: Int[Tensor, "batch"] | Int[Tensor, "batch t"]
) -> Iterator[dict[int, Tensor]]:
    """Hook `hook_pattern` of `layers` only; yields layer -> [batch, T, heads, key] rows of the
    query positions, filled by the next forward (gradients flow through them).

    Hooks are removed on exit, also on error. Layers not listed keep SDPA attention.
    """
    index = query_index(query_positions)
    captured: dict[int, Tensor] = {}

    def make_hook(layer: int):
        def hook(pattern: Tensor, hook=None) -> None:
            rows = torch.arange(pattern.shape[0], device=pattern.device)[:, None]
            # [batch, heads, q, k] -> [batch, T, heads, k]
            captured[layer] = pattern.permute(0, 2, 1, 3)[rows, index.to(pattern.device)]

        return hook

    for layer in layers:
        if not 0 <= layer < model.cfg.n_layers:
            raise UserInputError(f"focus layer {layer} is outside the model's {model.cfg.n_layers} layers")
        if model.cfg.is_linear_attention(layer):
            softmax = [x for x in range(model.cfg.n_layers) if not model.cfg.is_linear_attention(x)]
            raise UserInputError(f"focus layer {layer} is a linear-attention (Gated DeltaNet) layer: it has no "
                                 f"attention pattern to focus; choose among the softmax-attention layers {softmax}")
    hooks = [(f"blocks.{layer}.attn.hook_pattern", make_hook(layer)) for layer in layers]
    with model.hooks(fwd_hooks=hooks):
        yield captured


def run_with_focus(
    model: HookedVLM,
    inputs,
    prior: FocusPrior,
    layers: Sequence[int] | None = None,
    query_positions: Int[Tensor, "batch"] | Int[Tensor, "batch t"] | None = None,
    eps: float = DEFAULT_EPS,
) -> tuple[Float[Tensor, "batch pos d_vocab"], Float[Tensor, ""]]:
    """One forward returning (logits, L_focus).

    Args:
        model: the model; inputs: its `VLMInputs` (`model.prepare`), with token regions.
        prior: the object prior over the image tokens (`focus_prior`).
        layers: the layers whose attention L_focus reads; default `model_focus_layers(model)`.
        query_positions: [batch] or [batch, t] the query positions; default the final prompt
            position of each row (`inputs.regions.final`).
        eps: added inside the log of the attention mass on the prior.
    Returns:
        (logits [batch, pos, d_vocab], L_focus: a scalar tensor that gradients flow through).
    """
    layers = model_focus_layers(model) if layers is None else list(layers)
    if query_positions is None:
        query_positions = inputs.regions.final
    with capture_patterns(model, layers, query_positions) as captured:
        logits = model(inputs)
    return logits, focus_loss(captured, prior, eps)

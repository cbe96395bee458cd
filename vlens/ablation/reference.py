"""Reference activations for ablation: each head's mean `hook_z` output over a reference set
(over all positions, or per aligned position) and, for resampling, the per-example outputs.

Alignment (prompts of a reference set differ in length and layout):
- "all": one mean per head over every real (non-padding) position of the reference set.
- "position": per position counted from the end of the prompt (offset 0 = final prompt
  token), i.e. right-aligned; with left padding this is the column counted from the right.
- "region": image tokens by (image index, merged grid, row-major index in the grid; a tiled
  image's tokens by their tile record: kind, layout cell, grid, index in it); text
  before the first image counted from the start, text after the last image counted from
  the end, text between images i and i+1 counted from the end of image i.
A position whose slot the reference set never saw (a longer prompt, another grid) falls back
to the all-positions mean. Padding positions are never counted.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

import torch
from jaxtyping import Float, Int
from torch import Tensor
from tqdm.auto import tqdm

from vlens.ablation.tasks import TaskBatch
from vlens.core.hooks import act_name
from vlens.core.inputs import TokenRegions, VLMInputs
from vlens.parallel.options import SweepOptions, fold_legacy
from vlens.utils.errors import UserInputError

if TYPE_CHECKING:
    from vlens.core.model import HookedVLM

ALIGNMENTS: tuple[str, ...] = ("all", "position", "region")
Key = tuple


def check_alignment(alignment: str) -> str:
    """`alignment` if it is one of `ALIGNMENTS` (else a `UserInputError`)."""
    if alignment not in ALIGNMENTS:
        raise UserInputError(f"unknown alignment {alignment!r}: use one of {ALIGNMENTS} (see vlens.ablation.reference)")
    return alignment


def row_position_keys(regions: TokenRegions, row: int, alignment: str) -> tuple[Int[Tensor, "n"], list[Key]]:
    """The real positions of one row and the alignment key of each.

    alignment "all" keys positions like "position" (resampling still needs positions).
    """
    check_alignment(alignment)
    final = int(regions.final[row])
    images = [t.tolist() for t in regions.images[row]]
    positions = sorted(regions.text[row].tolist() + [p for img in images for p in img])
    if alignment != "region" or not images:
        return torch.tensor(positions, dtype=torch.long), [("end", final - p) for p in positions]
    first_real, first_image, last_image = positions[0], images[0][0], images[-1][-1]
    key_of: dict[int, Key] = {}
    for i, (img, grid) in enumerate(zip(images, regions.image_grid[row], strict=True)):
        for k, p in enumerate(img):
            key_of[p] = ("image", i, *grid, k)
        records = regions.tiles[row][i] if regions.tiles else []
        if any(r.kind not in ("image", "cls") for r in records):  # a tiled image: the same tile, the same cell
            for r in records:
                for k, p in enumerate(r.positions.tolist()):
                    key_of[p] = ("image", i, r.kind, r.layout, *r.grid, k)
    for p in regions.text[row].tolist():
        if p < first_image:
            key_of[p] = ("start", p - first_real)
        elif p > last_image:
            key_of[p] = ("end", final - p)
        else:
            inside = [j for j, img in enumerate(images) if img[0] < p < img[-1]]
            if inside:  # a text token among an image's tokens (Idefics3's tags and separators)
                key_of[p] = ("within", inside[0], p - images[inside[0]][0])
                continue
            # between image i and image i + 1
            i = max(j for j, img in enumerate(images) if img[-1] < p)
            key_of[p] = ("between", i, p - images[i][-1] - 1)
    return torch.tensor(positions, dtype=torch.long), [key_of[p] for p in positions]


@dataclass
class ReferenceActivations:
    """Head outputs (`hook_z`) summarised over a reference set.

    Attributes:
        alignment: "all", "position" or "region" (module docstring); what `mean_values` uses.
        global_mean: per layer [n_heads, d_head] (that layer's own head shape: a hybrid decoder's
            linear-attention layers differ), mean over every real reference position.
        slot_keys: the aligned positions (slots) seen; slot_means per layer [n_slots, n_heads,
            d_head] and slot_counts [n_slots] (how many reference positions fell in each).
        n_examples, n_positions: size of the reference set (examples, real positions).
        samples: for resampling, per layer [n_positions, n_heads, d_head] every reference
            position's output; sample_index [n_examples, n_slots] row into samples, or -1.
    """

    alignment: str
    global_mean: list[Float[Tensor, "n_heads d_head"]]
    slot_keys: list[Key]
    slot_means: list[Float[Tensor, "n_slots n_heads d_head"]]
    slot_counts: Int[Tensor, "n_slots"]
    n_examples: int
    n_positions: int
    samples: list[Tensor] | None = None
    sample_index: Int[Tensor, "n_examples n_slots"] | None = None

    def slot_ids(self, inputs: VLMInputs) -> Int[Tensor, "batch pos"]:
        """Slot of every position of `inputs` (-1: padding or a slot the reference never saw)."""
        lookup = {key: i for i, key in enumerate(self.slot_keys)}
        ids = torch.full(tuple(inputs.input_ids.shape), -1, dtype=torch.long)
        for row in range(inputs.batch_size):
            positions, keys = row_position_keys(inputs.token_regions, row, self.alignment)
            ids[row, positions] = torch.tensor([lookup.get(k, -1) for k in keys], dtype=torch.long)
        return ids

    def mean_values(self, layer: int, inputs: VLMInputs,
                    slot_ids: Tensor | None = None) -> Float[Tensor, "batch pos n_heads d_head"]:
        """The mean each head's output is replaced by, at every position of `inputs`."""
        if self.alignment == "all":
            return self.global_mean[layer].expand(*inputs.input_ids.shape, *self.global_mean[layer].shape)
        return self._aligned_means(layer, self.slot_ids(inputs) if slot_ids is None else slot_ids)

    def resample_values(self, layer: int, inputs: VLMInputs, partners: Sequence[int],
                        slot_ids: Tensor | None = None) -> Float[Tensor, "batch pos n_heads d_head"]:
        """Each row's head outputs taken from reference example `partners[row]` at the same
        aligned position (its slot mean, then the global mean, where that example lacks it)."""
        if self.samples is None or self.sample_index is None:
            raise UserInputError("resample ablation needs per-example reference outputs: build the reference with "
                             "collect_reference(..., keep_samples=True)")
        slots = self.slot_ids(inputs) if slot_ids is None else slot_ids
        fallback = self._aligned_means(layer, slots)
        partner = torch.as_tensor(list(partners), dtype=torch.long)
        if partner.numel() != inputs.batch_size or bool((partner < 0).any() | (partner >= self.n_examples).any()):
            raise UserInputError(f"partners must give one reference example in [0, {self.n_examples}) per row")
        rows = torch.where(slots >= 0, self.sample_index[partner[:, None], slots.clamp(min=0)], -1)
        rows = rows.to(fallback.device)
        taken = self.samples[layer][rows.clamp(min=0)]
        return torch.where((rows >= 0)[..., None, None], taken, fallback)

    def _aligned_means(self, layer: int, slots: Tensor) -> Tensor:
        """Slot means at known slots, the global mean elsewhere."""
        base = self.global_mean[layer].expand(*slots.shape, *self.global_mean[layer].shape)
        slots = slots.to(base.device)
        return torch.where((slots >= 0)[..., None, None], self.slot_means[layer][slots.clamp(min=0)], base)


def _accumulate(z: Tensor, hook, where: tuple[Tensor, Tensor, Tensor], sums: Tensor,
                samples: list[Tensor] | None) -> None:
    """Add one batch's real-position head outputs into their slots (`sums` [n_slots, H, d])."""
    rows, cols, slots = where
    picked = z[rows.to(z.device), cols.to(z.device)].detach().float()  # [n_real, H, d]
    sums.index_add_(0, slots.to(sums.device), picked.to(sums.device))
    if samples is not None:
        samples.append(picked)


def resample_partners(n_eval: int, n_reference: int, seed: int = 0) -> list[int]:
    """Reference example for each evaluation example: a seeded permutation, cycled if needed."""
    order = torch.randperm(n_reference, generator=torch.Generator().manual_seed(seed)).tolist()
    return [order[i % n_reference] for i in range(n_eval)]


def collect_reference(
    model: HookedVLM,
    reference: Iterable[VLMInputs] | TaskBatch,
    alignment: str = "region",
    keep_samples: bool = False,
    options: SweepOptions | None = None,
    **legacy: Any,
) -> ReferenceActivations:
    """Run the reference set once and summarise every head's `hook_z` output.

    Args:
        model: the model.
        reference: a `TaskBatch` (run in chunks of `options.batch_size`, default 16) or an
            iterable of `VLMInputs`.
        alignment: "all", "position" or "region" (see the module docstring).
        keep_samples: also keep every reference position's output (needed for resampling).
        options: `batch_size`, `progress`, `cache_device` (where the means and samples are
            kept; default the unembedding's device) (`vlens.SweepOptions`).
    Returns:
        `ReferenceActivations`: global_mean [n_layers, n_heads, d_head], slot_means
        [n_layers, n_slots, n_heads, d_head], and the samples when kept.
    """
    options = fold_legacy(options, legacy, "collect_reference", ("batch_size", "progress"))
    batch_size, progress = options.batch(16), options.shown
    check_alignment(alignment)
    cfg = model.cfg
    if isinstance(reference, TaskBatch):
        task = reference
        batches: Iterator[VLMInputs] = (task.inputs(model, range(s, min(s + batch_size, len(task))))
                   for s in range(0, len(task), batch_size))
        total = -(-len(task) // batch_size)
    else:
        batches, total = iter(reference), None
    lookup: dict[Key, int] = {}
    device = model.unembed.device if options.cache_device is None else options.cache_device
    # per layer [n_slots, n_heads, d_head]: each layer's own head shape
    sums = [torch.zeros(0, cfg.heads_at(layer), cfg.d_head_at(layer), dtype=torch.float32, device=device)
            for layer in range(cfg.n_layers)]
    counts = torch.zeros(0, dtype=torch.long)
    samples: list[list[Tensor]] = [[] for _ in range(cfg.n_layers)]
    example_slots: list[dict[int, int]] = []  # per reference example: slot -> sample row
    n_positions = 0
    for inputs in tqdm(batches, total=total, desc="reference means", disable=not progress):
        rows: list[int] = []
        cols: list[int] = []
        slot_list: list[int] = []
        for row in range(inputs.batch_size):
            positions, keys = row_position_keys(inputs.token_regions, row, alignment)
            ids = [lookup.setdefault(k, len(lookup)) for k in keys]
            example_slots.append({s: n_positions + len(slot_list) + j for j, s in enumerate(ids)})
            rows += [row] * len(ids)
            cols += positions.tolist()
            slot_list += ids
        slot_idx = torch.tensor(slot_list, dtype=torch.long)
        if len(lookup) > sums[0].shape[0]:
            grow = len(lookup) - sums[0].shape[0]
            sums = [torch.cat([layer_sums, layer_sums.new_zeros(grow, *layer_sums.shape[1:])]) for layer_sums in sums]
            counts = torch.cat([counts, counts.new_zeros(grow)])
        counts.index_add_(0, slot_idx, torch.ones_like(slot_idx))
        n_positions += len(slot_list)
        where = (torch.tensor(rows), torch.tensor(cols), slot_idx)
        hooks: list[tuple[str | Callable, Callable]] = [(act_name("z", layer), partial(_accumulate, where=where, sums=sums[layer],
                                               samples=samples[layer] if keep_samples else None))
                 for layer in range(cfg.n_layers)]
        with torch.no_grad():
            model.run_with_hooks(inputs, return_type=None, fwd_hooks=hooks)
    if n_positions == 0:
        raise UserInputError("the reference set is empty: give at least one example with real tokens")
    dtype = cfg.dtype
    slot_means = [(layer_sums / counts.clamp(min=1).to(device)[:, None, None]).to(dtype) for layer_sums in sums]
    global_mean = [(layer_sums.sum(dim=0) / n_positions).to(dtype) for layer_sums in sums]
    sample_tensors, sample_index = None, None
    if keep_samples:
        sample_tensors = [torch.cat(per_layer).to(device, dtype) for per_layer in samples]
        sample_index = torch.full((len(example_slots), len(lookup)), -1, dtype=torch.long)
        for example, slot_rows in enumerate(example_slots):
            sample_index[example, list(slot_rows)] = torch.tensor(list(slot_rows.values()), dtype=torch.long)
    return ReferenceActivations(
        alignment=alignment, global_mean=global_mean, slot_keys=list(lookup), slot_means=slot_means,
        slot_counts=counts, n_examples=len(example_slots), n_positions=n_positions,
        samples=sample_tensors, sample_index=sample_index,
    )

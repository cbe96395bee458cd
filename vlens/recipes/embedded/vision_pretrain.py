"""The vision pretraining stage: the tower and merger trained alone on dense cell labels.

Real VLMs start from a pretrained vision encoder. Here the encoder learns, from the
synthetic scenes' own ground truth, what each merged image token should carry: the shape
and colour of the object in its cell and how many object centres it holds
(vlens.recipes.embedded.vision_aux). No language model runs, so a step costs a vision
forward and backward only. Images are flipped and turned by multiples of 90 degrees per
draw (the labels move with them), which multiplies the variety of a pre-rendered set by 8.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import cast

import torch
from jaxtyping import Int, UInt8

from vlens.recipes.embedded.batches import patchify
from vlens.recipes.embedded.loop import Schedule, TrainingState, run_loop
from vlens.recipes.embedded.train import image_tokens, linear_patch_embedding
from vlens.recipes.embedded.vision_aux import IGNORE, LABEL_KINDS, VisionAuxHeads

AUGMENT_STREAM = 7_919  # seeds each step's flips and turns: seed * AUGMENT_STREAM + step


def dihedral(
    images: UInt8[torch.Tensor, "batch size size 3"],
    labels: Int[torch.Tensor, "batch kinds cells"],
    generator: torch.Generator,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each image (and its grid of cell labels) turned by a random multiple of 90 degrees
    and flipped left-right half of the time."""
    batch, kinds, cells = labels.shape
    grid = int(round(cells**0.5))
    turns = torch.randint(4, (batch,), generator=generator).tolist()
    flips = torch.randint(2, (batch,), generator=generator).tolist()
    out_images, out_labels = [], []
    for image, label, turn, flip in zip(
        images, labels.view(batch, kinds, grid, grid), turns, flips, strict=True
    ):
        image, label = torch.rot90(image, turn, dims=(0, 1)), torch.rot90(label, turn, dims=(1, 2))
        if flip:
            image, label = image.flip(1), label.flip(2)
        out_images.append(image)
        out_labels.append(label.reshape(kinds, cells))
    return torch.stack(out_images).contiguous(), torch.stack(out_labels)


def _tokens(visual, images: torch.Tensor) -> torch.Tensor:
    device = next(visual.parameters()).device
    pixel_values, grid = patchify(images)
    out = visual(pixel_values.to(device), grid_thw=grid.to(device))
    return out.pooler_output if hasattr(out, "pooler_output") else out


@torch.no_grad()
def dense_accuracy(
    model, heads: VisionAuxHeads, images, labels: torch.Tensor, counts: list[int | None]
) -> dict:
    """Held-out accuracy of the heads: shape and colour on cells that hold an object, the
    centre-count class on every cell, and the image's count (the sum of the predicted
    centre counts) where `counts` gives it."""
    tokens = image_tokens(model, images)  # [n, cells, width]
    logits = heads.logits(tokens.reshape(-1, tokens.shape[-1]).to(next(heads.parameters()).device))
    flat = labels.permute(1, 0, 2).reshape(len(LABEL_KINDS), -1)
    result = {}
    for row, kind in enumerate(LABEL_KINDS):
        target = flat[row].to(logits[kind].device)
        keep = target != IGNORE
        if kind != "centres":
            keep &= target != 0  # object cells only: background is the easy majority
        predicted = logits[kind].argmax(-1)
        result[f"{kind}_cell_accuracy"] = round((predicted[keep] == target[keep]).float().mean().item(), 4)
    per_image = logits["centres"].argmax(-1).view(len(tokens), -1).sum(1).cpu()
    known = [(int(per_image[i]), count) for i, count in enumerate(counts) if count is not None]
    if known:
        result["count_accuracy"] = round(sum(p == c for p, c in known) / len(known), 4)
    return result


def pretrain_vision(
    model,
    images,
    labels: torch.Tensor,
    settings: Schedule,
    log_path: str | Path,
    state: TrainingState | None = None,
    held_out: tuple | None = None,
    progress: bool = True,
    snapshot: Callable[[int, dict], None] | None = None,
) -> dict:
    """Train `model.model.visual` (tower + merger) alone on dense labels; the decoder is
    untouched.

    images: uint8 [n, size, size, 3] (tensor or ImageStore); labels: int [n, 3, cells]
    (vision_aux.dense_labels). held_out: (images, labels, counts) measured at each
    checkpoint (dense_accuracy), then passed with the step to `snapshot` (e.g. to write the
    model). Returns run_loop's summary plus "held_out" (the final measurement).
    """
    visual = model.model.visual
    heads = VisionAuxHeads(model.config.vision_config.out_hidden_size, settings.seed).to(
        next(visual.parameters()).device
    )
    modules = {"visual": visual, "heads": heads}

    def step_fn(step: int, rows: list[int]) -> tuple[torch.Tensor, dict[str, float]]:
        generator = torch.Generator().manual_seed(settings.seed * AUGMENT_STREAM + step)
        batch_images, batch_labels = dihedral(images[rows], labels[rows], generator)
        tokens = _tokens(visual, batch_images)
        target = batch_labels.permute(1, 0, 2).reshape(len(LABEL_KINDS), -1).to(tokens.device)
        losses = heads.losses(tokens, target)
        total = cast(torch.Tensor, sum(losses.values()))
        return total, {
            "loss": total.item(),
            **{f"{kind}_loss": value.item() for kind, value in losses.items()},
        }

    def measure(step: int) -> dict:
        numbers = dense_accuracy(model, heads, *held_out) if held_out is not None else {}
        if snapshot is not None:
            snapshot(step, numbers)
        return numbers

    with linear_patch_embedding(visual):
        summary = run_loop(
            modules, step_fn, len(images), settings, log_path, state, measure, progress, "vision pretraining"
        )
    summary["held_out"] = dense_accuracy(model, heads, *held_out) if held_out is not None else {}
    return summary

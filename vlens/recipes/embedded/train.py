"""A language stage of the embedded model: the loss on answer tokens (and, optionally, the
dense vision objective), with the vision tower trained along or frozen.

With `freeze_vision` the tower and merger keep their weights; their image tokens are then
computed once per image before training (no vision forward per step, which makes a frozen
stage several times cheaper on a CPU) and fed to the decoder through HF's
`mm_encoder_outputs`, exactly where the tower's output would go.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path

import torch
from tqdm.auto import tqdm
from transformers.modeling_outputs import BaseModelOutputWithPooling

from vlens.recipes.embedded.batches import EncodedExample, collate, collate_text, patchify
from vlens.recipes.embedded.loop import TrainingState, run_loop
from vlens.recipes.embedded.settings import TrainSettings
from vlens.recipes.embedded.vision_aux import VisionAuxHeads, captured_image_tokens
from vlens.utils.errors import UserInputError

__all__ = ["TrainSettings", "train_model", "image_tokens", "linear_patch_embedding"]


@contextmanager
def linear_patch_embedding(visual):
    """Within the block the tower's patch embedding runs as one matrix product on a single
    frame: a still image fills both frames of Qwen's 2-frame patches, so the Conv3d equals
    a linear map of one frame by the sum of the two frames' kernels (same parameters and
    gradients; about 20% faster training on a CPU). Restored on exit, also on error."""
    embed = visual.patch_embed
    weight = embed.proj.weight  # [width, 3, frames, patch, patch]
    width, channels, frames, patch, _ = weight.shape

    def forward(hidden_states: torch.Tensor) -> torch.Tensor:
        pixels = hidden_states.view(-1, channels, frames, patch * patch)[:, :, 0].reshape(
            -1, channels * patch * patch
        )
        kernel = weight.view(width, channels, frames, patch * patch).sum(2).reshape(width, -1)
        return torch.nn.functional.linear(pixels.to(weight.dtype), kernel)

    embed.forward = forward
    try:
        yield
    finally:
        del embed.forward  # back to the class's Conv3d forward


@torch.no_grad()
def image_tokens(model, images, batch_size: int = 64, progress: bool = False) -> torch.Tensor:
    """The merged image tokens of every image: float32 [n_images, cells, width] (images:
    anything indexable by a list of rows into uint8 [rows, size, size, 3])."""
    visual = model.model.visual
    device = next(visual.parameters()).device
    was_training = visual.training
    visual.eval()
    chunks = []
    try:
        for start in tqdm(range(0, len(images), batch_size), desc="image tokens", disable=not progress):
            batch = images[list(range(start, min(start + batch_size, len(images))))]
            pixel_values, grid = patchify(batch)
            out = visual(pixel_values.to(device), grid_thw=grid.to(device))
            tokens = out.pooler_output if hasattr(out, "pooler_output") else out
            chunks.append(tokens.view(len(batch), -1, tokens.shape[-1]).float().cpu())
    finally:
        visual.train(was_training)
    return torch.cat(chunks)


def with_partners(rows: list[int], partners: list[int | None]) -> list[int]:
    """The batch of a minimal-pair run: the first half of the sampled rows, each followed by
    its partner (or by a row of the second half when it has none); same length as `rows`."""
    half = len(rows) - len(rows) // 2
    batch = []
    for index, row in enumerate(rows[:half]):
        batch.append(row)
        partner = partners[row]
        if len(batch) < len(rows):
            batch.append(partner if partner is not None else rows[half + index])
    return batch


def train_model(
    model,
    examples: list[EncodedExample],
    images,
    settings: TrainSettings,
    pad_id: int,
    image_token_id: int,
    log_path: str | Path,
    on_checkpoint: Callable[[int], dict] | None = None,
    progress: bool = True,
    cell_labels: torch.Tensor | None = None,
    state: TrainingState | None = None,
    partners: list[int | None] | None = None,
) -> dict:
    """Train `model` in place on `examples` (sampled uniformly with replacement).

    images: uint8 [n_images, H, W, 3] (a tensor or an ImageStore) indexed by the examples.
    cell_labels: int [n_images, 3, cells] (vision_aux.dense_labels), needed when
    settings.vision_aux_weight > 0; the auxiliary heads are trained alongside and dropped.
    `state` (loop.TrainingState) makes the run resumable; `on_checkpoint(step)` runs at its
    checkpoints. `partners` (example index -> its minimal pair's index or None,
    vlens.recipes.embedded.minimal_pairs): each batch is half sampled examples and half their
    partners (an example without one is followed by another sampled example), so both
    questions about an image meet in one step. Returns {"steps", "wall_time_s", "final_loss",
    "log"} (final_loss: the smoothed answer-token loss).
    """
    if partners is not None and len(partners) != len(examples):
        raise UserInputError(f"partners has {len(partners)} entries for {len(examples)} examples")
    if not examples:
        raise UserInputError("train_model needs at least one example")
    if settings.freeze_vision and settings.vision_aux_weight > 0:
        raise UserInputError("the vision objective trains the tower: it cannot be used with a frozen tower")
    device = next(model.parameters()).device  # batches are built on the CPU and moved there
    visual = model.model.visual
    modules: dict[str, torch.nn.Module] = {"model": model}
    heads = None
    if settings.vision_aux_weight > 0:
        if cell_labels is None:
            raise UserInputError("vision_aux_weight > 0 needs cell_labels for the images")
        heads = VisionAuxHeads(model.config.vision_config.out_hidden_size, settings.seed).to(device)
        modules["heads"] = heads
    cached = None
    if settings.freeze_vision:
        visual.requires_grad_(False)
        cached = image_tokens(model, images, progress=progress)

    def step_fn(_step: int, rows: list[int]) -> tuple[torch.Tensor, dict[str, float]]:
        if partners is not None:
            rows = with_partners(rows, partners)
        batch_examples = [examples[row] for row in rows]
        image_rows = [example.image_index for example in batch_examples]
        if cached is not None:
            visual.eval()  # frozen: it does not run, but keep its mode fixed
            batch = collate_text(batch_examples, pad_id, image_token_id, grid=cached.shape[1])
            features = cached[image_rows].reshape(-1, cached.shape[-1]).to(device)
            batch = {name: tensor.to(device) for name, tensor in batch.items()}
            # one tensor per image, as HF's own get_image_features leaves it (annotated as one tensor)
            encoded = BaseModelOutputWithPooling(pooler_output=[features])  # type: ignore[arg-type]
            output = model(**batch, mm_encoder_outputs={"image": encoded})
            return output.loss, {"loss": output.loss.item()}
        batch = collate(batch_examples, images, pad_id, image_token_id)
        batch = {name: tensor.to(device, non_blocking=True) for name, tensor in batch.items()}
        capture: AbstractContextManager[list] = captured_image_tokens(model) if heads is not None else nullcontext([])
        with capture as captured:
            loss = answer_loss = model(**batch).loss
        numbers = {"loss": answer_loss.item()}
        if heads is not None and cell_labels is not None:  # heads are only made with cell_labels
            labels = cell_labels[image_rows].permute(1, 0, 2).reshape(3, -1).to(device)
            aux = heads.losses(captured[0], labels)
            loss = answer_loss + settings.vision_aux_weight * sum(aux.values())
            numbers.update({f"vision_{kind}_loss": value.item() for kind, value in aux.items()})
        return loss, numbers

    patching = linear_patch_embedding(visual) if not settings.freeze_vision else nullcontext()
    try:
        with patching:
            return run_loop(
                modules, step_fn, len(examples), settings, log_path, state, on_checkpoint, progress
            )
    finally:
        if settings.freeze_vision:
            visual.requires_grad_(True)

"""The training loop of the embedded model: AdamW, linear warm-up then cosine decay,
loss on answer tokens only, a tqdm bar and a JSONL training log."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

from vlens.recipes.embedded.batches import EncodedExample, collate
from vlens.recipes.embedded.vision_aux import VisionAuxHeads, captured_image_tokens
from vlens.training.schedule import learning_rate_at


@dataclass
class TrainSettings:
    """Optimisation hyper-parameters (the recipe's defaults are in vlens.recipes.embedded.recipe)."""

    steps: int = 3500
    batch_size: int = 48
    learning_rate: float = 2e-3
    warmup_steps: int = 200
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    seed: int = 0
    log_every: int = 25
    stop_after: int | None = None  # stop early at this step; the schedule still spans `steps`
    vision_aux_weight: float = (
        0.0  # > 0: add the dense vision-token loss of vlens.recipes.embedded.vision_aux
    )

    @property
    def steps_to_run(self) -> int:
        return self.steps if self.stop_after is None else min(self.stop_after, self.steps)

    def rate_at(self, step: int) -> float:
        """Linear warm-up to learning_rate, then cosine decay to 5% of it."""
        return learning_rate_at(step, self.steps, self.learning_rate, self.warmup_steps, "cosine", floor=0.05)


def train_model(
    model: torch.nn.Module,
    examples: list[EncodedExample],
    images: torch.Tensor,
    settings: TrainSettings,
    pad_id: int,
    image_token_id: int,
    log_path: str | Path,
    on_checkpoint: Callable[[int], dict] | None = None,
    checkpoint_every: int = 0,
    progress: bool = True,
    cell_labels: torch.Tensor | None = None,
) -> dict:
    """Train `model` in place on `examples` (sampled uniformly with replacement).

    images: uint8 [n_images, H, W, 3] indexed by the examples. Every `checkpoint_every`
    steps (0: never) `on_checkpoint(step)` is called; what it returns is logged.
    cell_labels: int [n_images, 2, cells] (vlens.recipes.embedded.vision_aux.cell_labels), needed when
    settings.vision_aux_weight > 0; the auxiliary heads are trained alongside and dropped.
    Returns {"steps", "wall_time_s", "final_loss"} (final_loss: the answer-token loss).
    """
    if not examples:
        raise ValueError("train_model needs at least one example")
    device = next(model.parameters()).device  # batches are built on the CPU and moved there
    heads = None
    if settings.vision_aux_weight > 0:
        if cell_labels is None:
            raise ValueError("vision_aux_weight > 0 needs cell_labels for the images")
        heads = VisionAuxHeads(model.config.vision_config.out_hidden_size, settings.seed).to(device)
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    generator = torch.Generator().manual_seed(settings.seed)
    parameters = [*model.parameters(), *(heads.parameters() if heads is not None else [])]
    optimizer = torch.optim.AdamW(
        parameters, lr=settings.learning_rate, weight_decay=settings.weight_decay, betas=(0.9, 0.98)
    )
    model.train()
    start = time.time()
    running_loss = None
    with (
        log_path.open("a") as log,
        tqdm(total=settings.steps_to_run, disable=not progress, desc="zoo train") as bar,
    ):
        log.write(
            json.dumps({"event": "start", "settings": asdict(settings), "examples": len(examples)}) + "\n"
        )
        for step in range(settings.steps_to_run):
            rows = torch.randint(len(examples), (settings.batch_size,), generator=generator).tolist()
            batch = collate([examples[row] for row in rows], images, pad_id, image_token_id)
            batch = {name: tensor.to(device, non_blocking=True) for name, tensor in batch.items()}
            for group in optimizer.param_groups:
                group["lr"] = settings.rate_at(step)
            capture = captured_image_tokens(model) if heads is not None else nullcontext([])
            with capture as image_tokens:
                loss = answer_loss = model(**batch).loss
            if heads is not None:
                image_rows = torch.tensor([examples[row].image_index for row in rows])
                labels = cell_labels[image_rows].permute(1, 0, 2).reshape(2, -1).to(device)
                aux_loss = heads.loss(image_tokens[0], labels)
                loss = answer_loss + settings.vision_aux_weight * aux_loss
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(parameters, settings.grad_clip)
            optimizer.step()

            value = answer_loss.item()
            running_loss = value if running_loss is None else 0.98 * running_loss + 0.02 * value
            bar.update(1)
            bar.set_postfix(loss=f"{running_loss:.4f}")
            if (step + 1) % settings.log_every == 0 or step + 1 == settings.steps_to_run:
                record = {
                    "step": step + 1,
                    "loss": value,
                    "smoothed_loss": running_loss,
                    "lr": optimizer.param_groups[0]["lr"],
                    **({"vision_aux_loss": aux_loss.item()} if heads is not None else {}),
                    "elapsed_s": round(time.time() - start, 1),
                }
                log.write(json.dumps(record) + "\n")
                log.flush()
            if checkpoint_every and (step + 1) % checkpoint_every == 0 and step + 1 < settings.steps_to_run:
                model.eval()
                extra = on_checkpoint(step + 1) if on_checkpoint else {}
                model.train()
                log.write(json.dumps({"event": "checkpoint", "step": step + 1, **extra}) + "\n")
                log.flush()
    model.eval()
    return {
        "steps": settings.steps_to_run,
        "wall_time_s": round(time.time() - start, 1),
        "final_loss": running_loss,
    }

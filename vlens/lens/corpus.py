"""Images + prompts for lenses: task-suite samples or an imagefolder, batched through the model.

A sample is ``(image, prompt, record)``; records carry the task metadata (``task``,
``answer``, ``count``, ...) used by the head scores.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
from jaxtyping import Float
from torch import Tensor

from vlens.data import TASKS, make_task_sample
from vlens.datasets import record_dicts
from vlens.parallel.options import SweepOptions, fold_legacy
from vlens.utils.errors import UserInputError
from vlens.utils.validation import check_count
from vlens.zoo.image_sizes import render_size

if TYPE_CHECKING:
    from vlens.core.model import HookedVLM

Sample = tuple[Any, str, dict]
POSITION_KINDS = ("final", "text", "all")


def task_samples(n: int, seed: int = 0, size: int | None = None, style: str = "synpoly",
                 tasks: Sequence[str] | None = None) -> list[Sample]:
    """`n` task-suite samples, cycling through `tasks` (default: all of ``vlens.data.TASKS``).

    size: image side in px; None: the embedded model's own size (`vlens.zoo.image_sizes`; pass
    ``render_size(model)`` for another model's)."""
    tasks = tuple(tasks or TASKS)
    size = render_size(image_size=size)
    if n < 1:
        raise UserInputError(f"need at least one sample, got n={n}")
    out = []
    for i in range(n):
        image, record = make_task_sample(tasks[i % len(tasks)], seed=seed + i, size=size, style=style)
        out.append((image, record["question"], record))
    return out


def dataset_samples(dataset, limit: int | None = None) -> list[Sample]:
    """Samples from any dataset of the shared layer (:func:`vlens.datasets.load_dataset`): the image
    (or list of images), the question (with options) and the row as a record (answer, count, ...).
    Records whose images cannot be read are skipped by file name."""
    limit = check_count(limit, "limit", allow_none=True)  # a negative limit would slice from the end
    return [(row["image"], row["question"], row) for row in record_dicts(dataset, limit)]


def prepare_batch(model: HookedVLM, chunk: Sequence[Sample]) -> tuple[Any, list[dict]]:
    """``(VLMInputs, records)`` of some samples (left-padded, chat format)."""
    inputs = model.prepare(images=[s[0] for s in chunk], prompts=[s[1] for s in chunk])
    return inputs.to(model.unembed.device), [s[2] for s in chunk]


def position_mask(inputs, positions: str) -> Tensor:
    """bool [batch, pos] of the training positions: "final", "text" (non-image, non-pad) or "all"."""
    if positions not in POSITION_KINDS:
        raise UserInputError(f"positions must be one of {POSITION_KINDS}, got {positions!r}")
    return inputs.regions.mask(positions, inputs.input_ids.shape[1])


def collect_residuals(model: HookedVLM, samples: Sequence[Sample], positions: str = "text",
                      options: SweepOptions | None = None, **legacy: Any) -> Float[Tensor, "n n_layers d_model"]:
    """``blocks.{l}.hook_resid_post`` for every layer at the chosen positions, in fp32.

    The last layer's column is the final residual (input of ``ln_final``): the lens target.

    Args:
        model: the model.
        samples: (image, prompt, record) triples.
        positions: "text" (every non-image, non-padding position), "final" or "all".
        options: `batch_size` (samples per forward, default 8), `progress`, `sharding` (the
            batches split across processes; every process gets all rows), `cache_device`
            (where the rows are collected; default the CPU) (`vlens.SweepOptions`).
    Returns:
        [n_positions, n_layers, d_model], fp32.
    """
    options = fold_legacy(options, legacy, "collect_residuals", ("batch_size", "progress", "sharding"))
    batch_size, progress = options.batch(8), options.progress
    sharding = options.shards
    where = torch.device("cpu") if options.cache_device is None else options.cache_device
    names = {f"blocks.{layer}.hook_resid_post" for layer in range(model.cfg.n_layers)}

    def run(start: int) -> Tensor:
        inputs, _ = prepare_batch(model, samples[start:start + batch_size])
        with torch.no_grad():
            _, cache = model.run_with_cache(inputs, names_filter=lambda name: name in names, return_type=None)
        mask = position_mask(inputs, positions).to(model.unembed.device)
        stacked = torch.stack([cache[f"blocks.{layer}.hook_resid_post"] for layer in range(model.cfg.n_layers)], 2)
        return stacked[mask].float().to(where)  # [n_positions, n_layers, d_model]

    rows = sharding.map(range(0, len(samples), batch_size), run, desc="collecting residuals", progress=progress)
    return torch.cat(rows)

"""Whole datasets on disk, in parallel, identical whatever the number of workers.

Sample ``i`` of a dataset with seed ``s`` uses its own seed (:func:`sample_seed`) and its
own count (``counts[i % len(counts)]``, so counts are balanced), so workers never share
randomness and the output does not depend on how samples are split between them.

Generation streams: each sample's PNG and metadata row are on disk before the next window of
samples is rendered, so memory stays flat whatever ``n`` (at most `MAX_SAMPLES`).
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from PIL import Image
from tqdm import tqdm

from vlens.data.generators import RENDERERS
from vlens.data.imagefolder import MetadataWriter, image_file_name, prepare_out_dir, save_png
from vlens.data.pairs import make_pair
from vlens.data.scene import check_seed
from vlens.data.tasks import DEFAULT_COUNTS, make_task_sample
from vlens.data.templates import TASKS
from vlens.utils.errors import UserInputError
from vlens.utils.provenance import stamp
from vlens.utils.validation import check_count

DATASET_KINDS: tuple[str, ...] = ("syndot", "synpoly", "synreal", "pairs", "tasks")
MAX_SAMPLES = 10_000_000  # a sanity bound on --n (about 10^7 PNGs); split larger sets into folders
_WINDOW_PER_WORKER = 64  # samples in flight per worker: bounds the memory of a parallel run


def sample_seed(seed: int, index: int) -> int:
    """The seed of sample ``index`` of a dataset generated with ``seed`` (a uint32)."""
    return int(np.random.SeedSequence([check_seed(seed), index]).generate_state(1)[0])


@dataclass(frozen=True)
class DatasetSpec:
    """What to generate. ``options`` are passed to the renderer (radius, min_gap, background,
    allow_empty; pairs: style, kind, deltas, n_changed; tasks: style, tasks)."""

    kind: str
    n: int
    seed: int
    size: int = 224
    counts: tuple[int, ...] = DEFAULT_COUNTS
    options: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind not in DATASET_KINDS:
            raise UserInputError(f"unknown dataset kind {self.kind!r}; choose one of {DATASET_KINDS}")
        check_count(self.n, "--n", max=MAX_SAMPLES)
        check_count(self.size, "--size", min=28)
        if not self.counts:
            raise UserInputError("counts must not be empty: give the object counts to draw, e.g. counts=(1, 2, 3)")
        check_seed(self.seed)


def _pair_counts(spec: DatasetSpec, index: int, rng: np.random.Generator) -> tuple[int, int | None]:
    """(n_clean, n_corrupt) of pair ``index``: the corrupt count differs by a delta, in range."""
    n_clean = spec.counts[index % len(spec.counts)]
    if spec.options.get("kind", "count") != "count":
        return n_clean, None
    lo, hi = min(spec.counts), max(spec.counts)
    deltas = spec.options.get("deltas", (1, 2, 3))
    delta = int(deltas[int(rng.integers(len(deltas)))])
    sign = 1 if rng.integers(2) else -1
    for n_corrupt in (n_clean + sign * delta, n_clean - sign * delta):
        if lo <= n_corrupt <= hi:
            return n_clean, n_corrupt
    # delta too large for this count: take the farthest count that fits
    n_corrupt = hi if hi - n_clean >= n_clean - lo else lo
    if n_corrupt == n_clean:
        raise UserInputError(f"count pairs need at least two different counts, got counts={list(spec.counts)}")
    return n_clean, n_corrupt


def render_sample(spec: DatasetSpec, index: int) -> list[tuple[str, Image.Image, dict]]:
    """Render sample ``index``: a list of (file name, image, record) (two for a pair)."""
    seed = sample_seed(spec.seed, index)
    opts = dict(spec.options)
    if spec.kind in RENDERERS:
        count = spec.counts[index % len(spec.counts)]
        image, record = RENDERERS[spec.kind](count, seed, spec.size, **opts)
        return [(image_file_name(index), image, record)]
    if spec.kind == "tasks":
        tasks = opts.pop("tasks", TASKS)
        task = tasks[index % len(tasks)]
        image, record = make_task_sample(task, seed, spec.size, counts=spec.counts, **opts)
        return [(image_file_name(index), image, record)]
    n_clean, n_corrupt = _pair_counts(spec, index, np.random.default_rng([seed, 99]))
    opts.pop("deltas", None)
    pair = make_pair(n_clean, n_corrupt, seed, size=spec.size, pair_id=f"{index:06d}", **opts)
    return [(f"{index:06d}_{rec['role']}.png", img, rec) for img, rec in pair.samples()]


def _write_sample(job: tuple[DatasetSpec, int, str]) -> list[tuple[str, dict]]:
    spec, index, out_dir = job
    rows = []
    for name, image, record in render_sample(spec, index):
        save_png(image, os.path.join(out_dir, name))
        rows.append((name, record))
    return rows


def _run_jobs(spec: DatasetSpec, out_dir: str, workers: int) -> Iterator[list[tuple[str, dict]]]:
    """Rows of each sample in index order, rendering at most a window of samples ahead."""
    if workers <= 1:
        for index in range(spec.n):
            yield _write_sample((spec, index, out_dir))
        return
    window = workers * _WINDOW_PER_WORKER
    chunksize = max(1, min(64, spec.n // (workers * 8)))
    with multiprocessing.get_context("fork" if os.name == "posix" else "spawn").Pool(workers) as pool:
        for start in range(0, spec.n, window):  # Pool.imap would queue every job at once
            jobs = [(spec, i, out_dir) for i in range(start, min(start + window, spec.n))]
            yield from pool.imap(_write_sample, jobs, chunksize=min(chunksize, max(1, len(jobs) // workers)))


def generate_dataset(
    spec: DatasetSpec,
    out_dir: str | os.PathLike,
    workers: int = 1,
    overwrite: bool = False,
    progress: bool = False,
) -> Path:
    """Render ``spec`` into an imagefolder at ``out_dir`` with ``workers`` processes.

    Returns the directory. The bytes written do not depend on ``workers``.
    """
    check_count(workers, "--workers")
    out = prepare_out_dir(out_dir, overwrite, info=stamp({"kind": spec.kind, "n": spec.n, "seed": spec.seed}))
    unit = "pairs" if spec.kind == "pairs" else "images"
    writer = MetadataWriter(out)
    try:
        with tqdm(total=spec.n, unit=unit, disable=not progress, desc=f"vlens data {spec.kind}") as bar:
            for sample_rows in _run_jobs(spec, str(out), workers):
                for name, record in sample_rows:
                    writer.write(name, record)
                bar.update(1)
    except BaseException:
        writer.abort()
        raise
    writer.close()
    return out

"""The activation source: the hook's values at the chosen regions, grid cells, and the on-disk cache."""

from __future__ import annotations

import pytest
import torch

from tests.helpers.models import tiny_vlm
from vlens.sae.activations import ActivationOptions, ActivationSource
from vlens.testing import random_image
from vlens.utils.errors import UserInputError

HOOK = "blocks.0.hook_resid_post"


@pytest.fixture(scope="module")
def model():
    return tiny_vlm("qwen2_5_vl")


@pytest.fixture(scope="module")
def examples():
    return [(random_image(seed=i), f"how many {'a ' * (i % 3)}") for i in range(5)]


@pytest.mark.parametrize("positions", ["image", "text", "final", "all"])
def test_chunks_are_the_hook_at_the_region(model, examples, positions):
    source = ActivationSource(model, examples, ActivationOptions(HOOK, positions=positions, prompts_per_chunk=2))
    assert source.n_chunks == 3
    chunk = source.chunk(1)
    inputs = model.prepare(images=[[examples[2][0]], [examples[3][0]]], prompts=[examples[2][1], examples[3][1]])
    _, cache = model.run_with_cache(inputs, names_filter=[HOOK])
    mask = inputs.regions.mask(positions, inputs.seq_len)
    assert torch.allclose(chunk.acts, cache[HOOK][mask].float())
    assert chunk.sites is not None and chunk.sites.example.tolist() == (mask.nonzero()[:, 0] + 2).tolist()
    assert bool(chunk.sites.is_image.all()) == (positions == "image")


def test_cells_keep_only_those_image_grid_cells(model, examples):
    source = ActivationSource(model, examples[:1], ActivationOptions(HOOK, cells=((0, 0), (1, 1))))
    chunk = source.chunk(0)
    assert chunk.sites is not None
    assert sorted(map(tuple, chunk.sites.cell.tolist())) == [(0, 0), (1, 1)]
    full = ActivationSource(model, examples[:1], ActivationOptions(HOOK)).chunk(0)
    assert full.sites is not None
    rows, cols = model.prepare(images=[examples[0][0]], prompts=["x"]).regions.image_grid[0][0]
    assert full.acts.shape[0] == rows * cols
    assert torch.equal(chunk.acts[0], full.acts[0]) and torch.equal(chunk.acts[1], full.acts[cols + 1])


def test_disk_cache_is_reused_and_guarded(model, examples, tmp_path):
    options = ActivationOptions(HOOK, positions="text", prompts_per_chunk=2)
    first = ActivationSource(model, examples, options, cache_dir=tmp_path).chunk(2)
    assert (tmp_path / "chunk_000002.safetensors").exists()
    again = ActivationSource(model, examples, options, cache_dir=tmp_path)
    again.compute = None  # type: ignore[assignment]  # a cached chunk never runs the model
    assert torch.equal(again.chunk(2).acts, first.acts)
    with pytest.raises(UserInputError, match="caches other activations"):
        ActivationSource(model, examples, ActivationOptions(HOOK, positions="image"), cache_dir=tmp_path)
    with pytest.raises(UserInputError):
        ActivationOptions(HOOK, positions="text", cells=((0, 0),))

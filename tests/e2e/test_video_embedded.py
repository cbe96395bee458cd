"""Video on the embedded model (a Qwen2.5-VL whose processor takes video; slow: run with -m slow): frame
patching runs end to end, the all-frames patch at layer 0 reproduces the corrupt run, circuits and an SAE
activation source read the video's frame cells."""

from __future__ import annotations

import pytest
import torch

from vlens.patching import build_pair_batch, make_video_count_pairs, patch_layer_frame
from vlens.zoo.image_sizes import CELL, embedded_image_size

pytestmark = pytest.mark.slow
torch.set_num_threads(1)
SIZE = embedded_image_size()  # frames drawn at the model's own size
GRID = SIZE // CELL


@pytest.fixture(scope="module")
def embedded():
    import vlens

    model = vlens.load()
    return model, build_pair_batch(model, make_video_count_pairs(2, seed=3, frames=4, size=SIZE))


def test_frame_patching_runs_and_all_frames_reproduce_the_corrupt_run(embedded):
    model, batch = embedded
    regions = batch.clean.regions
    assert regions.image_grid[0] == [(GRID, GRID)] and [len(row[0]) for row in regions.frames] == [2, 2]
    result = patch_layer_frame(model, batch, layers=[0])
    assert result.cells == ["f0", "f1"]
    # both frames at layer 0's residual: every video token is the corrupt run's, the text is the same
    name = "blocks.0.hook_resid_pre"
    _, cache = model.run_with_cache(batch.corrupt, names_filter=[name])
    video = batch.clean.regions.mask("image", batch.seq_len)

    def write(act, hook):
        return torch.where(video[..., None].to(act.device), cache[name], act)

    logits = model.run_with_hooks(batch.clean, fwd_hooks=[(name, write)])[torch.arange(2), regions.final]
    corrupt = model(batch.corrupt)[torch.arange(2), regions.final]
    torch.testing.assert_close(logits, corrupt, atol=1e-4, rtol=0)


def test_circuit_nodes_and_sae_source_on_the_embedded_model(embedded):
    from vlens.circuits import CircuitGraph
    from vlens.sae.activations import ActivationOptions, ActivationSource

    model, batch = embedded
    graph = CircuitGraph.for_batch(model, batch.clean.regions, image_nodes=(2, 2))
    half = round(GRID / 2)  # two near-equal blocks a side: rows / cols 0 .. half-1 and half .. GRID-1
    low, high = f"0-{half - 1}", f"{half}-{GRID - 1}"
    assert [n.name for n in graph.inputs[1:5]] == [f"img0.f0[r{low},c{low}]", f"img0.f0[r{low},c{high}]",
                                                   f"img0.f0[r{high},c{low}]", f"img0.f0[r{high},c{high}]"]
    pairs = make_video_count_pairs(1, seed=4, frames=4, size=SIZE)
    source = ActivationSource(model, [{"video": pairs[0].clean_image, "question": pairs[0].clean_prompt}],
                              ActivationOptions("blocks.1.hook_resid_post", positions="image"))
    assert source.chunk(0).acts.shape == (2 * GRID * GRID, model.cfg.d_model)

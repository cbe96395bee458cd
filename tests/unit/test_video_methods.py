"""The methods on video (tiny Qwen2.5-VL): video counting pairs with known layouts, frame patching
against a plain hook run and a known zero, a circuit with frame-cell input nodes, an SAE activation source."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.helpers.models import tiny_vlm
from vlens.data import make_video_pair, video_array
from vlens.patching import build_pair_batch, examples_from_pairs, make_video_count_pairs, patch_layer_frame
from vlens.utils.errors import UserInputError

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def tiny():
    return tiny_vlm("qwen2_5_vl", n_layers=2, d_model=32, n_heads=4, n_kv_heads=2)


def _late_pair(n_clean: int, n_corrupt: int, seed: int = 0):
    """The first pair (by seed) whose differing object appears in frame 2 or later: the first temporal
    patch (frames 0-1) is then the same in both videos."""
    while True:
        pair = make_video_pair(n_clean, n_corrupt, frames=4, seed=seed, size=56)
        changed = {o["id"]: o["appears"] for o in pair.corrupt_record["objects"] + pair.clean_record["objects"]}
        if min(changed[i] for i in pair.changed) >= 2:
            return pair
        seed += 1


def test_video_pair_known_layout():
    pair = make_video_pair(2, 4, frames=5, seed=3, size=56)
    clean, corrupt = pair.counts_per_frame("clean"), pair.counts_per_frame("corrupt")
    assert clean[-1] == 2 and corrupt[-1] == 4 and clean == sorted(clean) and corrupt == sorted(corrupt)
    assert pair.clean_record["answer"] == "2" and pair.corrupt_record["answer"] == "4" and len(pair.changed) == 2
    first_change = min(o["appears"] for o in pair.corrupt_record["objects"] if o["id"] in pair.changed)
    for f, (a, b) in enumerate(zip(video_array(pair.clean_frames), video_array(pair.corrupt_frames), strict=True)):
        assert np.array_equal(a, b) == (f < first_change)  # identical exactly until a differing object appears
    again = make_video_pair(2, 4, frames=5, seed=3, size=56)
    assert np.array_equal(video_array(again.corrupt_frames), video_array(pair.corrupt_frames))
    with pytest.raises(UserInputError, match="frames must be a positive integer"):
        make_video_pair(2, 4, frames=0)


@pytest.mark.filterwarnings("ignore::UserWarning")  # a random model: its logit difference is within the noise floor
def test_frame_patching_equals_plain_hooks_and_is_zero_on_a_shared_frame(tiny):
    pairs = [_late_pair(2, 3), _late_pair(3, 1, seed=50)]
    batch = build_pair_batch(tiny, examples_from_pairs(pairs))
    regions = batch.clean.regions
    assert [len(row[0]) for row in regions.frames] == [2, 2] and regions.videos == [[0], [0]]
    result = patch_layer_frame(tiny, batch, component="resid_pre")
    assert result.cells == ["f0", "f1"] and result.per_pair_logit_diff.shape[:2] == (2, 2)
    # frame 0 shows the same pixels in both roles and Qwen's vision tower attends within a temporal
    # patch: its layer-0 residual is the same, so patching it changes nothing
    unpatched = result.per_pair_logit_diff[0, 0]
    clean_logits = tiny(batch.clean)[torch.arange(2), regions.final]
    clean_ld = clean_logits[torch.arange(2), batch.corrupt_tokens] - clean_logits[torch.arange(2), batch.clean_tokens]
    torch.testing.assert_close(unpatched, clean_ld, atol=1e-5, rtol=0)
    # frame 1 at layer 1: the same as writing the corrupt run's activations with a plain hook
    name = "blocks.1.hook_resid_pre"
    _, cache = tiny.run_with_cache(batch.corrupt, names_filter=[name])

    def write(act, hook):
        act = act.clone()
        for row in range(2):
            positions = regions.frames[row][0][1]
            act[row, positions] = cache[name][row, positions]
        return act

    logits = tiny.run_with_hooks(batch.clean, fwd_hooks=[(name, write)])[torch.arange(2), regions.final]
    expected = logits[torch.arange(2), batch.corrupt_tokens] - logits[torch.arange(2), batch.clean_tokens]
    torch.testing.assert_close(result.per_pair_logit_diff[1, 1], expected, atol=1e-5, rtol=0)
    assert not torch.allclose(result.per_pair_logit_diff[1, 1], clean_ld, atol=1e-4)


def test_circuit_nodes_select_frame_cells(tiny):
    from vlens.circuits import CircuitGraph, edge_attribution

    batch = build_pair_batch(tiny, make_video_count_pairs(2, seed=1, frames=4, size=56))
    graph = CircuitGraph.for_batch(tiny, batch.clean.regions)
    names = [node.name for node in graph.inputs]
    assert names[1:] == [f"img0.f{k}[r{r},c{c}]" for k in range(2) for r in range(2) for c in range(2)]
    masks = graph.input_masks(batch.clean.regions, batch.seq_len)
    for index, node in enumerate(graph.inputs[1:], start=1):
        k, r, c = int(node.name[6]), node.rows[0], node.cols[0]
        for row in range(2):
            assert masks[index, row].nonzero().flatten().tolist() == \
                batch.clean.regions.frame_cell(row, 0, k, (r, c)).tolist()
    scores = edge_attribution(tiny, batch, method="eap")
    assert torch.isfinite(scores.scores).all() and scores.graph.inputs[1].name == "img0.f0[r0,c0]"


def test_sae_source_reads_video_tokens(tiny):
    from vlens.sae.activations import ActivationOptions, ActivationSource

    pair = make_video_pair(2, 3, frames=4, seed=0, size=56)
    examples = [{"video": pair.clean_frames, "question": "How many dots are there?", "fps": 2.0},
                {"video": pair.corrupt_frames, "question": "How many dots are there?", "fps": 2.0}]
    source = ActivationSource(tiny, examples, ActivationOptions("blocks.0.hook_resid_post", positions="image",
                                                                cells=((1, 0),)))
    chunk = source.chunk(0)
    inputs = source.inputs(source.prompts(0)[1])
    _, cache = tiny.run_with_cache(inputs, names_filter=["blocks.0.hook_resid_post"])
    want = torch.cat([cache["blocks.0.hook_resid_post"][row, inputs.regions.frame_cell(row, 0, k, (1, 0))]
                      for row in range(2) for k in range(2)])
    torch.testing.assert_close(chunk.acts, want.float(), atol=0, rtol=0)
    assert chunk.sites.cell.tolist() == [[1, 0]] * 4


def test_knockout_of_a_frame_equals_masking_its_keys(tiny):
    """Knocking frame 1 out of the final position's reads equals -inf scores from the final query to its keys."""
    from vlens.flow import knockout_logits

    pair = make_video_pair(2, 3, frames=4, seed=0, size=56)
    inputs = tiny.prepare(videos=[pair.clean_frames], prompts=["How many dots are there?"])
    frame = inputs.regions.frame(0, 0, 1)
    final = int(inputs.regions.final[0])
    ours = knockout_logits(tiny, inputs, src=[frame], dst=inputs.regions.final)

    def mask(scores, hook):
        scores = scores.clone()
        scores[0, :, final, frame] = float("-inf")
        return scores

    names = [f"blocks.{layer}.attn.hook_attn_scores" for layer in range(tiny.cfg.n_layers)]
    expected = tiny.run_with_hooks(inputs, fwd_hooks=[(name, mask) for name in names])
    torch.testing.assert_close(ours, expected, atol=1e-5, rtol=0)
    assert not torch.allclose(ours[0, final], tiny(inputs)[0, final], atol=1e-4)

"""Video inputs on Qwen2.5-VL and Qwen3-VL: logits and greedy tokens equal HF's on the same video tensors,
frame regions equal the token layout computed by hand, the patch layout and Qwen3-VL's timestamped prompt
equal what HF's processors write."""

from __future__ import annotations

import functools
import types

import numpy as np
import pytest
import torch
from PIL import Image

from tests.helpers.arch_parity import assert_generate_matches_hf, assert_logits_match
from vlens.testing import random_image
from vlens.utils.errors import UserInputError

# sizes unlike the image tests': Qwen2-VL with 5 heads over 1; Qwen2.5-VL with GQA 3:1 and 3 layers; Qwen3-VL
# with d_head 20 and DeepStack
FAMILIES = {
    "qwen2_vl": dict(n_layers=2, d_model=40, n_heads=5, n_kv_heads=1, mrope_section=[2, 1, 1]),
    "qwen2_5_vl": dict(n_layers=3, d_model=48, n_heads=6, n_kv_heads=2, mrope_section=[2, 1, 1]),
    "qwen3_vl": dict(n_heads=4, n_kv_heads=1, d_head=20, mrope_section=[4, 3, 3], deepstack_visual_indexes=[0, 2]),
}


@functools.lru_cache(maxsize=3)
def _pair(family: str):
    from vlens import HookedVLM
    from vlens.testing import tiny_hf_model, tiny_qwen3_vl_model, tiny_qwen3_vl_processor, tiny_qwen_processor

    if family == "qwen3_vl":
        hf = tiny_qwen3_vl_model(seed=3, **FAMILIES[family])
        return hf, HookedVLM.from_hf(hf, processor=tiny_qwen3_vl_processor())
    hf = tiny_hf_model(family, seed=2, **FAMILIES[family])
    return hf, HookedVLM.from_hf(hf, processor=tiny_qwen_processor())


def _side(family: str) -> int:
    return 32 if family == "qwen3_vl" else 28  # pixels per merged token


def _video(family: str, n: int, cols: int = 3, rows: int = 2, seed: int = 0) -> list[Image.Image]:
    side = _side(family)
    return [random_image(cols * side, rows * side, seed + k) for k in range(n)]


def _cases(model, family: str) -> dict:
    side = _side(family)
    image = random_image(2 * side, 3 * side, 11)
    array = np.stack([np.asarray(f) for f in _video(family, 4, 2, 2, seed=20)])  # [T, H, W, 3] uint8
    return {
        "one_video_odd_frames": model.prepare(videos=[_video(family, 5)], prompts=["How many dots are there?"]),
        "image_then_video": model.prepare(images=[[image]], videos=[[_video(family, 4)]], prompts=["red ?"]),
        "two_videos_one_prompt": model.prepare(videos=[[_video(family, 2), array]], prompts=["What colour"], fps=1.0),
        "padded_batch_video_image_text": model.prepare(
            images=[None, image, None], videos=[_video(family, 3, 2, 3), None, None],
            prompts=["How many dots are there?", "red", "yes no"], fps=4.0),
    }


@pytest.mark.parametrize("family", list(FAMILIES))
def test_video_logits_match_hf(family):
    hf, model = _pair(family)
    assert_logits_match(model, hf, _cases(model, family))


@pytest.mark.parametrize("family", list(FAMILIES))
def test_video_generate_matches_hf(family):
    hf, model = _pair(family)
    assert_generate_matches_hf(model, hf, _cases(model, family)["padded_batch_video_image_text"], max_new_tokens=4)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_frame_regions_match_the_token_layout(family):
    """5 frames of 3x2 merged tokens: 3 temporal patches of 2 frames (the last frame repeated), each a
    2x3 grid; Qwen2.5-VL's patches are consecutive, Qwen3-VL's each follow a timestamp and a
    <|vision_start|>; the image comes first in the row's images, the video second."""
    hf, model = _pair(family)
    image = random_image(2 * _side(family), 2 * _side(family), 5)
    inputs = model.prepare(images=[[image]], videos=[[_video(family, 5)]], prompts=["red ?"], fps=2.0)
    regions = inputs.regions
    ids = inputs.input_ids[0]
    pads = (ids == model.cfg.video_token_id).nonzero().flatten()
    assert regions.videos == [[1]] and regions.image_grid[0] == [(2, 2), (2, 3)]
    assert inputs.video_grid_thw.tolist() == [[3, 4, 6]]
    frames = regions.frames[0][0]
    assert len(frames) == 3
    starts = (ids == model.cfg.vision_start_token_id).nonzero().flatten().tolist()
    for k, frame in enumerate(frames):
        if family == "qwen3_vl":  # its own <|vision_start|> (the image's is the first one)
            first = starts[1 + k] + 1
        else:
            first = int(pads[0]) + 6 * k
        assert frame.tolist() == list(range(first, first + 6))
    assert torch.equal(regions.images[0][1], pads) and torch.equal(torch.cat(frames), pads)
    assert regions.frame_times == [[[0.0, 1.0, 2.0]]]  # 2 frames per patch at 2 fps
    assert regions.frame(0, 0, 2).tolist() == frames[2].tolist()
    assert regions.frame_cell(0, 0, 1, (1, 2)).tolist() == [int(frames[1][5])]
    labels = model.to_str_tokens(inputs)[0]
    assert labels[int(frames[1][5])] == "<img1.f1[r1,c2]>" and labels[int(regions.images[0][0][0])] == "<img0[r0,c0]>"
    with pytest.raises(UserInputError, match="is a video"):
        regions.image_view(0, 1)
    # a row's selection keeps its video tensors
    both = model.prepare(videos=[_video(family, 2), _video(family, 4, 2, 2)], prompts=["red", "How many"])
    second = both.select_rows([1])
    alone = model.prepare(videos=[_video(family, 4, 2, 2)], prompts=["How many"])
    assert torch.equal(second.pixel_values_videos, alone.pixel_values_videos)
    assert torch.equal(second.video_grid_thw, alone.video_grid_thw)
    with torch.no_grad():
        torch.testing.assert_close(model(second)[0, -1], model(alone)[0, -1], atol=1e-5, rtol=0)


def test_patches_hold_consecutive_frames():
    """Each temporal patch's T slots hold consecutive frames (channel, then frame, then pixels, as Qwen's video
    processor lays them out); an odd frame count repeats the last frame. Frames of one grey level each."""
    from vlens.core.architectures.video import qwen_video_patches
    from vlens.testing.qwen import qwen_image_processor

    processor = qwen_image_processor()
    levels = [10, 60, 110, 160, 210]
    frames = [Image.new("RGB", (84, 56), (v, v, v)) for v in levels]
    patches, grid = qwen_video_patches(processor, frames, 2)
    assert grid == [3, 4, 6]
    mean, std = torch.tensor(processor.image_mean), torch.tensor(processor.image_std)
    layout = patches.view(3, 24, 3, 2, 14, 14)  # [t, cells, C, T, P, P]
    for t in range(3):
        for slot in range(2):
            level = levels[min(2 * t + slot, 4)] / 255
            expected = (level - mean) / std
            got = layout[t, :, :, slot].mean(dim=(0, 2, 3))
            torch.testing.assert_close(got, expected.float(), atol=1e-5, rtol=0)


def test_qwen3_prompt_equals_hf_processors_expansion():
    """The timestamped placeholder text equals `Qwen3VLProcessor.replace_video_token` on the same grid."""
    from transformers.models.qwen3_vl.processing_qwen3_vl import Qwen3VLProcessor

    from vlens.testing import tiny_qwen3_vl_processor

    _, model = _pair("qwen3_vl")
    processor = tiny_qwen3_vl_processor()
    frames = _video("qwen3_vl", 5)
    made = model.adapter.process_videos(processor, [frames], 3.0)
    ours = model.adapter.video_prompt(processor, made, 0, 3.0, 5)
    stub = types.SimpleNamespace(video_processor=types.SimpleNamespace(merge_size=2, temporal_patch_size=2),
                                 vision_start_token="<|vision_start|>", vision_end_token="<|vision_end|>",
                                 video_token="<|video_pad|>")
    stub._calculate_timestamps = functools.partial(Qwen3VLProcessor._calculate_timestamps, stub)
    metadata = types.SimpleNamespace(fps=3.0, frames_indices=list(range(5)))
    theirs = Qwen3VLProcessor.replace_video_token(stub, {"video_grid_thw": made["video_grid_thw"],
                                                         "video_metadata": [metadata]}, 0)
    assert ours == theirs and "<0.2 seconds>" in ours


def test_time_positions_follow_fps():
    """Qwen2.5-VL's M-RoPE time index of temporal patch k is k * tokens_per_second * seconds per patch."""
    hf, model = _pair("qwen2_5_vl")
    for fps in (1.0, 4.0):
        inputs = model.prepare(videos=[_video("qwen2_5_vl", 6)], prompts=["red"], fps=fps)
        positions, _ = model.adapter.position_ids(hf, inputs)
        frames = inputs.regions.frames[0][0]
        start = int(positions[0, 0, frames[0][0]])
        per_patch = hf.config.vision_config.tokens_per_second * 2 / fps
        assert [int(positions[0, 0, f[0]]) - start for f in frames] == [int(k * per_patch) for k in range(3)]


def test_bad_video_inputs_are_refused():
    _, model = _pair("qwen2_5_vl")
    with pytest.raises(UserInputError, match="different sizes"):
        model.prepare(videos=[[random_image(56, 56, 0), random_image(84, 56, 1)]], prompts=["red"])
    with pytest.raises(UserInputError, match="video entries for 2 prompts"):
        model.prepare(videos=[_video("qwen2_5_vl", 2)] * 3, prompts=["red", "blue"])
    with pytest.raises(UserInputError, match=r"\[frames, height, width, 3\]"):
        model.prepare(videos=[np.zeros((2, 28, 28, 3, 1), dtype=np.uint8)], prompts=["red"])


@pytest.mark.parametrize("family", ["llava", "glm4v"])
def test_family_without_video_refuses(family):
    """LLaVA-1.5 has no video path; GLM-4V's adapter extends Qwen2-VL's but its videos are not Qwen's."""
    from tests.helpers.models import tiny_vlm

    model = tiny_vlm(family)
    with pytest.raises(UserInputError, match="takes no video"):
        model.prepare(videos=[[random_image(56, 56, 0)] * 2], prompts=["red"])

"""Video inputs on LLaVA-OneVision and LLaVA-NeXT-Video: logits and greedy tokens equal HF's on the same
video tensors, frame regions equal the token layout by hand, the frames' preprocessing on known pixels."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch
from PIL import Image

from tests.helpers.arch_parity import assert_generate_matches_hf, assert_logits_match
from vlens.testing import random_image
from vlens.utils.errors import UserInputError

# (family, model kwargs, processor kwargs): towers, strategies, pooling modes unlike the image tests'
SHAPES = {
    "onevision_siglip": ("llava_onevision", dict(n_layers=3, d_model=48, n_heads=6, n_kv_heads=3), {}),
    "next_video_clip_avg": ("llava_next_video", dict(n_heads=4, n_kv_heads=1), {}),
    "next_video_siglip_max": ("llava_next_video", dict(tower="siglip", vision_feature_select_strategy="full",
                                                       vision_feature_layer=-1, spatial_pool_mode="max",
                                                       text_model="qwen2", n_heads=2, n_kv_heads=2),
                              dict(strategy="full", cls_token=False)),
}


@functools.lru_cache(maxsize=3)
def _pair(shape: str):
    from vlens import HookedVLM
    from vlens.testing import (
        tiny_llava_next_video_model,
        tiny_llava_next_video_processor,
        tiny_llava_onevision_model,
        tiny_llava_onevision_processor,
    )

    family, model_kwargs, processor_kwargs = SHAPES[shape]
    if family == "llava_onevision":
        hf = tiny_llava_onevision_model(seed=4, **model_kwargs)
        return hf, HookedVLM.from_hf(hf, processor=tiny_llava_onevision_processor(**processor_kwargs))
    hf = tiny_llava_next_video_model(seed=5, **model_kwargs)
    return hf, HookedVLM.from_hf(hf, processor=tiny_llava_next_video_processor(**processor_kwargs))


def _frames(n: int, seed: int = 0, size=(40, 30)) -> list[Image.Image]:
    return [random_image(size[0], size[1], seed + k) for k in range(n)]


def _cases(model) -> dict:
    image = random_image(50, 40, 11)
    array = np.stack([np.asarray(f) for f in _frames(3, 30, (36, 36))])
    return {
        "one_video": model.prepare(videos=[_frames(4)], prompts=["How many dots are there?"]),
        "image_then_video": model.prepare(images=[[image]], videos=[[_frames(3, 7)]], prompts=["red ?"]),
        "two_videos_one_prompt": model.prepare(videos=[[_frames(3, 9), array]], prompts=["What colour"]),
        "padded_batch_video_image_text": model.prepare(
            images=[None, image, None], videos=[_frames(3, 20), None, None],
            prompts=["How many dots are there?", "red", "yes no"]),
    }


@pytest.mark.parametrize("shape", list(SHAPES))
def test_video_logits_match_hf(shape):
    hf, model = _pair(shape)
    assert model.adapter.family == SHAPES[shape][0]
    assert_logits_match(model, hf, _cases(model))


@pytest.mark.parametrize("shape", list(SHAPES))
def test_video_generate_matches_hf(shape):
    hf, model = _pair(shape)
    assert_generate_matches_hf(model, hf, _cases(model)["padded_batch_video_image_text"], max_new_tokens=4)


@pytest.mark.parametrize("shape", ["onevision_siglip", "next_video_clip_avg"])
def test_frame_regions_match_the_token_layout(shape):
    """32 px tiles of 8 px patches: a 4x4 grid per frame, pooled to 2x2 (OneVision: bilinear to ceil(4 / 2),
    then one newline closing the video; NeXT-Video: stride 2, no newline); 3 frames in order."""
    hf, model = _pair(shape)
    inputs = model.prepare(videos=[_frames(3)], prompts=["red ?"])
    regions = inputs.regions
    pads = (inputs.input_ids[0] == model.cfg.video_token_id).nonzero().flatten().tolist()
    onevision = model.adapter.family == "llava_onevision"
    assert len(pads) == 3 * 4 + int(onevision) and pads == list(range(pads[0], pads[0] + len(pads)))
    assert [f.tolist() for f in regions.frames[0][0]] == [pads[4 * k: 4 * k + 4] for k in range(3)]
    assert regions.image_grid == [[(2, 2)]] and regions.videos == [[0]]
    kinds = [(r.kind, r.positions.tolist()) for r in regions.tiles[0][0]]
    assert kinds[-1] == (("newline", [pads[-1]]) if onevision else ("frame", pads[8:12]))
    labels = model.to_str_tokens(inputs)[0]
    assert labels[pads[5]] == "<img0.f1[r0,c1]>"
    # each vision hook fires once: the frames' projector input and their final tokens
    _, cache = model.run_with_cache(inputs, names_filter=lambda n: n.startswith("vision.hook"))
    assert cache["vision.hook_frame_embeds"].shape == (3, 4, model.cfg.d_model)
    assert cache["vision.hook_video_features"].shape[0] == 3
    assert cache["vision.hook_image_embeds"].shape == (len(pads), model.cfg.d_model)


def test_frame_edit_matches_hf():
    """Zeroing frame 1's tokens at `vision.hook_frame_embeds` equals HF with those features zeroed in the
    projector's output (NeXT-Video: the projector runs last)."""
    hf, model = _pair("next_video_clip_avg")
    inputs = model.prepare(videos=[_frames(3)], prompts=["How many dots are there?"])

    def zero_frame(act, hook):
        act = act.clone()
        act[1] = 0
        return act

    ours = model.run_with_hooks(inputs, fwd_hooks=[("vision.hook_frame_embeds", zero_frame)])
    handle = hf.model.multi_modal_projector.register_forward_hook(
        lambda module, args, out: zero_frame(out, None) if out.shape[0] == 3 else out)
    try:
        with torch.no_grad():
            theirs = hf(**inputs.to_hf_kwargs()).logits
    finally:
        handle.remove()
    torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=0)
    assert not torch.allclose(ours, model(inputs), atol=1e-3)


def test_frame_preprocessing_on_known_pixels():
    """A 64x32 frame, green in its central 32x32 square and red at the sides: NeXT-Video's crop keeps only the
    green square; OneVision's squash keeps the red sides; both normalised by the processor's mean / std."""
    from vlens.core.architectures.video import normalized_frames

    frame = Image.new("RGB", (64, 32), (255, 0, 0))
    frame.paste((0, 255, 0), (16, 0, 48, 32))
    mean, std = [0.5, 0.4, 0.3], [0.2, 0.25, 0.5]
    cropped = normalized_frames([frame], (16, 16), mean, std, crop=True)
    squashed = normalized_frames([frame], (16, 16), mean, std, crop=False)
    green = torch.tensor([(0 - 0.5) / 0.2, (1 - 0.4) / 0.25, (0 - 0.3) / 0.5])
    assert cropped.shape == (1, 3, 16, 16)
    # the crop holds only the green square (its border columns blend a little red in, as bicubic resizing does)
    torch.testing.assert_close(cropped[0, :, :, 2:-2].mean(dim=(1, 2)), green, atol=1e-2, rtol=0)
    assert float(cropped[0, 0].max()) < (0.5 - 0.5) / 0.2
    torch.testing.assert_close(squashed[0, :, :, 8].mean(dim=1), green, atol=1e-2, rtol=0)  # the centre column is green
    torch.testing.assert_close(squashed[0, 0, :, 0], torch.full((16,), (1 - 0.5) / 0.2), atol=1e-2, rtol=0)


def test_videos_of_different_lengths_are_refused():
    _, model = _pair("onevision_siglip")
    with pytest.raises(UserInputError, match="same number of frames"):
        model.prepare(videos=[_frames(2), _frames(3)], prompts=["red", "blue"])

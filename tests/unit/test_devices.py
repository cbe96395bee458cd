"""Default devices / dtypes, the processor's resolution, caches on another device, AtP in chunks."""

from __future__ import annotations

import pytest
import torch

from vlens import SweepOptions
from vlens.core.devices import configure_resolution, resolve_device, resolve_dtype


def test_defaults_follow_the_machine():
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert resolve_device(None).type == expected
    assert resolve_dtype(None, "cpu") == torch.float32
    assert resolve_dtype("bf16") == torch.bfloat16 and resolve_dtype("float16") == torch.float16
    assert resolve_dtype(torch.float64) == torch.float64
    with pytest.raises(ValueError, match="unknown dtype 'int8'"):
        resolve_dtype("int8")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="no CUDA device"):
            resolve_device("cuda")


def test_resolution_sets_the_image_grid():
    from vlens.testing import random_image
    from vlens.testing.real_vocab import real_image_processor

    processor = real_image_processor("qwen2_5_vl")
    image = random_image(448, 448)
    assert processor(images=[image], return_tensors="pt")["image_grid_thw"].tolist() == [[1, 32, 32]]
    configure_resolution(processor, image_size=224)
    assert processor(images=[image], return_tensors="pt")["image_grid_thw"].tolist() == [[1, 16, 16]]
    configure_resolution(processor, max_pixels=112 * 112)
    assert processor(images=[image], return_tensors="pt")["image_grid_thw"].tolist() == [[1, 8, 8]]
    with pytest.raises(ValueError, match="min_pixels .* larger than max_pixels"):
        configure_resolution(processor, min_pixels=200, max_pixels=100)
    with pytest.raises(ValueError, match="no pixel budget"):
        configure_resolution(real_image_processor("llava"), max_pixels=100)


def test_load_in_bfloat16_at_a_resolution_and_cache_on_cpu():
    import vlens
    from vlens.testing import random_image

    model = vlens.load(device="cpu", dtype="bfloat16", image_size=56)
    assert model.cfg.dtype == torch.bfloat16 and model.W_U.dtype == torch.bfloat16
    inputs = model.prepare(images=[random_image(168, 168)], prompts=["How many dots are there?"])
    assert inputs.regions.image_grid[0] == [(2, 2)]
    _, cache = model.run_with_cache(inputs, device="cpu", names_filter=lambda n: n.endswith("hook_z"))
    assert all(v.device.type == "cpu" and v.dtype == torch.bfloat16 for v in cache.values())


def test_attribution_in_chunks_equals_one_batch():
    from tests.helpers.real_vocab import real_model
    from vlens.patching import attribution_patching, build_pair_batch, make_count_pairs

    model = real_model()
    batch = build_pair_batch(model, make_count_pairs(5, seed=1, size=56, counts=[9, 10, 11, 12, 13]))
    whole = attribution_patching(model, batch)
    chunked = attribution_patching(model, batch, options=SweepOptions(batch_size=2))
    for name in ("z", "q", "k", "resid_pre", "per_pair_z", "clean_logit_diff"):
        assert torch.allclose(getattr(whole, name), getattr(chunked, name), atol=1e-5), name
    assert whole.to_dict()["answers"]["clean_answer_tokens"] == chunked.to_dict()["answers"]["clean_answer_tokens"]


@pytest.mark.parametrize("family", ["llava_next", "llava_onevision"])
def test_anyres_image_size_bounds_the_tiling_resolution(family, tmp_path):
    """--image-size PX on an anyres folder keeps the pinpoints that fit in PX x PX, in the processor and the
    model (which reads them too), so a large image gets at most (PX // tile)^2 tiles; logits stay HF's."""
    from vlens import HookedVLM, testing
    from vlens.utils.errors import UserInputError

    if family == "llava_next":
        hf, processor = testing.tiny_llava_next_model(seed=1, tile=24, patch_size=8), \
            testing.tiny_llava_next_processor(tile=24, patch_size=8)
    else:
        hf, processor = testing.tiny_llava_onevision_model(seed=1, tile=24, patch_size=8), \
            testing.tiny_llava_onevision_processor(tile=24, patch_size=8)
    hf.save_pretrained(tmp_path)
    processor.save_pretrained(tmp_path)
    image = testing.random_image(72, 72, 3)
    full = HookedVLM.from_pretrained(str(tmp_path), device="cpu")
    assert full.adapter.tiles_per_image(full.prepare(images=[image], prompts=["red"])) == [1 + 9]
    model = HookedVLM.from_pretrained(str(tmp_path), device="cpu", image_size=50)
    kept = [[24, 24], [24, 48], [48, 24], [48, 48]]
    assert model.processor.image_processor.image_grid_pinpoints == kept
    assert model.hf_model.config.image_grid_pinpoints == kept
    inputs = model.prepare(images=[image], prompts=["red"])
    assert model.adapter.tiles_per_image(inputs) == [1 + 4]
    with torch.no_grad():
        torch.testing.assert_close(model(inputs), model.hf_model(**inputs.to_hf_kwargs()).logits, atol=1e-4, rtol=0)
    with pytest.raises(UserInputError, match="use at least 24"):
        configure_resolution(processor, image_size=20)
    with pytest.raises(UserInputError, match="no pixel budget"):
        configure_resolution(processor, max_pixels=100)

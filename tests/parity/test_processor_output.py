"""The processor's own output, as a user passes it (`model(processor(text=..., images=...))`), on every family
whose processor takes a list of images per prompt: the logits equal HF eager's on the same output at every
unpadded position, and `regions.image` is exactly the image placeholder tokens of each row.

A left-padded batch of a one-image prompt and a two-image prompt (three sizes and aspect ratios), through
the chat template: tiles, thumbnails, sub-images, row tags and newlines come from the processor, not
from `model.prepare`.
"""

from __future__ import annotations

import pytest
import torch

from tests.helpers.models import tiny_pair
from vlens.testing import random_image

FAMILIES = ["llava", "llava_next", "llava_onevision", "gemma3", "internvl", "idefics3", "smolvlm", "idefics2",
            "mistral3", "lfm2_vl", "aya_vision", "molmo2", "gemma4", "llama4", "phi4_multimodal"]


def _chat(processor, n_images: int, text: str) -> str:
    content = [{"type": "image"}] * n_images + [{"type": "text", "text": text}]
    return processor.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True)


@pytest.mark.parametrize("family", FAMILIES)
def test_processor_output_matches_hf_and_its_placeholders(family):
    hf, model = tiny_pair(family)
    processor = model.processor
    tokenizer = processor.tokenizer
    side, tokenizer.padding_side = tokenizer.padding_side, "left"
    try:
        out = processor(text=[_chat(processor, 1, "How many dots are there?"), _chat(processor, 2, "red")],
                        images=[[random_image(70, 40, 1)], [random_image(30, 50, 2), random_image(64, 64, 3)]],
                        padding=True, return_tensors="pt")
    finally:
        tokenizer.padding_side = side
    mask = out["attention_mask"].bool()
    assert not bool(mask[:, 0].all())  # the batch is padded on the left
    with torch.no_grad():
        expected = hf(**out).logits
        ours = model(out)
    torch.testing.assert_close(ours[mask], expected[mask], atol=1e-4, rtol=0)
    placeholders = out["input_ids"] == model.cfg.image_token_id  # Phi-4-multimodal's sits in its vision_config
    regions = model.coerce_inputs(out).regions
    for row in range(2):
        assert regions.image[row].tolist() == placeholders[row].nonzero().flatten().tolist()
    assert [len(images) for images in regions.images] == [1, 2]

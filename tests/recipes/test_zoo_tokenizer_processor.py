"""The embedded model's tokenizer and processor: Qwen's chat format, word-level tokens,
PIL image processing at a fixed size, and an offline save/load round trip."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from PIL import Image
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

from vlens.data import TEMPLATES, all_template_words
from vlens.recipes.embedded.batches import IGNORE_INDEX, collate, encode_example, patchify, to_model_image
from vlens.recipes.embedded.tokenizer import QWEN_SPECIAL_TOKENS, build_tokenizer, split_words
from vlens.recipes.embedded.vocabulary import vocabulary_words
from vlens.zoo.processor import (
    IMAGE_SIZE,
    MERGED_GRID,
    assemble_processor,
    build_image_processor,
    image_size_of,
    load_processor,
    save_processor_files,
)

EXPECTED_PROMPT = (
    "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>How many dots are there?<|im_end|>\n"
    "<|im_start|>assistant\n"
)


@pytest.fixture(scope="module")
def processor():
    return assemble_processor(build_tokenizer(vocabulary_words()), build_image_processor())


def test_vocabulary_covers_the_data_module_and_numbers():
    words = set(vocabulary_words())
    assert all_template_words(20) <= words
    assert {str(n) for n in range(21)} <= words
    assert {"difficult", "impossible", "none", "many", "?"} <= words
    for templates in TEMPLATES.values():
        for template in templates:
            fixed_text = re.sub(r"\{\w+\}", " ", template)
            assert set(split_words(fixed_text)) <= words, template


def test_chat_template_gives_qwen_prompt(processor):
    messages = [
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "How many dots are there?"}]}
    ]
    assert processor.apply_chat_template(messages, add_generation_prompt=True) == EXPECTED_PROMPT


def test_words_are_single_tokens_and_newline_survives(processor):
    tokenizer = processor.tokenizer
    ids = tokenizer(EXPECTED_PROMPT, add_special_tokens=False)["input_ids"]
    assert tokenizer.unk_token_id not in ids
    assert ids.count(tokenizer.convert_tokens_to_ids("\n")) == 3
    for special in QWEN_SPECIAL_TOKENS[:3] + ("<|vision_start|>", "<|image_pad|>", "<|vision_end|>"):
        assert len(tokenizer(special, add_special_tokens=False)["input_ids"]) == 1
    for number in range(21):
        (token,) = tokenizer(str(number), add_special_tokens=False)["input_ids"]
        assert tokenizer.decode([token]) == str(number)
    decoded = tokenizer.decode(ids, skip_special_tokens=True)
    assert "how many dots are there?" in decoded
    assert tokenizer.decode(tokenizer("How many dots are there?")["input_ids"]) == "how many dots are there?"


def test_any_square_image_size_becomes_the_fixed_grid(processor):
    prompt = EXPECTED_PROMPT
    # 300, 202 and 76 px landed one cell off (196 / 252 px) when the budget was exactly 224^2
    for size in [(224, 224), (100, 100), (300, 300), (202, 202), (76, 76), (1000, 1000)]:
        out = processor(images=[Image.new("RGB", size, "white")], text=[prompt], return_tensors="pt")
        assert out["image_grid_thw"].tolist() == [[1, 2 * MERGED_GRID, 2 * MERGED_GRID]]
        n_pad = int((out["input_ids"] == processor.image_token_id).sum())
        assert n_pad == MERGED_GRID**2 == 64


@pytest.mark.parametrize("size", [168, IMAGE_SIZE])
def test_patchify_and_encoding_match_the_processor(size):
    processor = assemble_processor(build_tokenizer(vocabulary_words()), build_image_processor(size))
    assert image_size_of(processor) == size
    rng = np.random.default_rng(0)
    images = [Image.fromarray(rng.integers(0, 256, (200, 200, 3), dtype=np.uint8)) for _ in range(2)]
    reference = processor(images=images, text=[EXPECTED_PROMPT + "3<|im_end|>"] * 2, return_tensors="pt")
    arrays = torch.from_numpy(np.stack([to_model_image(image, size) for image in images]))
    assert arrays.shape == (2, size, size, 3)
    pixel_values, grid = patchify(arrays)
    assert torch.equal(pixel_values, reference["pixel_values"])
    assert torch.equal(grid, reference["image_grid_thw"])

    examples = [encode_example(processor, "How many dots are there?", "3", index) for index in range(2)]
    batch = collate(examples, arrays, processor.tokenizer.pad_token_id, processor.image_token_id)
    assert torch.equal(batch["input_ids"], reference["input_ids"])
    assert torch.equal(batch["mm_token_type_ids"], reference["mm_token_type_ids"])
    assert int((batch["input_ids"][0] == processor.image_token_id).sum()) == (size // 28) ** 2
    supervised = batch["labels"][0][batch["labels"][0] != IGNORE_INDEX].tolist()
    assert processor.tokenizer.decode(supervised[:1]) == "3"
    assert supervised[1] == processor.tokenizer.eos_token_id


@pytest.mark.parametrize("size", [168, 224])
def test_every_square_size_maps_to_the_pinned_size(size):
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize

    image_processor = build_image_processor(size)
    low, high = image_processor.size["shortest_edge"], image_processor.size["longest_edge"]
    assert all(smart_resize(n, n, 28, low, high) == (size, size) for n in range(28, 1200))
    assert image_size_of(image_processor) == size
    # folders written before the slack pinned exactly size^2: still read as that size
    assert image_size_of(Qwen2VLImageProcessorPil(min_pixels=size * size, max_pixels=size * size)) == size


def test_image_sizes_must_be_multiples_of_the_token_cell():
    for bad in (0, 100, 170):
        with pytest.raises(ValueError, match="multiple of 28 px"):
            build_image_processor(bad)
    with pytest.raises(ValueError, match="square images"):
        patchify(torch.zeros(1, 168, 196, 3, dtype=torch.uint8))


def test_unknown_words_are_rejected(processor):
    with pytest.raises(ValueError, match="outside the vocabulary"):
        encode_example(processor, "How many zebras are there?", "3", 0)


def test_processor_files_round_trip_offline(processor, tmp_path):
    save_processor_files(processor.tokenizer, processor.image_processor, tmp_path)
    for name in (
        "tokenizer.json",
        "tokenizer_config.json",
        "preprocessor_config.json",
        "processor_config.json",
    ):
        assert (tmp_path / name).is_file()
    loaded = load_processor(tmp_path)
    assert type(loaded).__name__ == "Qwen2_5_VLProcessor"
    assert type(loaded.image_processor).__name__ == "Qwen2VLImageProcessorPil"
    image = Image.new("RGB", (224, 224), "white")
    a = processor(images=[image], text=[EXPECTED_PROMPT], return_tensors="pt")
    b = loaded(images=[image], text=[EXPECTED_PROMPT], return_tensors="pt")
    assert torch.equal(a["input_ids"], b["input_ids"]) and torch.equal(a["pixel_values"], b["pixel_values"])

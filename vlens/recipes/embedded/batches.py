"""Training examples and batches for the embedded model.

Images are kept as uint8 [size, size, 3] arrays (85 kB each at 168 px) and turned into
Qwen's flattened patches per batch (`patchify`, identical to the processor), so a large
pre-rendered training set fits in memory.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image
from transformers.image_utils import OPENAI_CLIP_MEAN, OPENAI_CLIP_STD

from vlens.core.processing import chat_messages
from vlens.utils.errors import UserInputError
from vlens.zoo.processor import (
    CELL,
    IMAGE_SIZE,
    MERGE_SIZE,
    PATCH_SIZE,
    TEMPORAL_PATCH_SIZE,
    check_image_size,
    image_size_of,
)

IGNORE_INDEX = -100
_MEAN = torch.tensor(OPENAI_CLIP_MEAN, dtype=torch.float32).view(1, 3, 1, 1)
_STD = torch.tensor(OPENAI_CLIP_STD, dtype=torch.float32).view(1, 3, 1, 1)


def to_model_image(image: Image.Image, size: int = IMAGE_SIZE) -> np.ndarray:
    """RGB uint8 array [size, size, 3]: the image resized as the processor does (bicubic)
    when it is not already `size` square."""
    image = image.convert("RGB")
    if image.size != (size, size):
        image = image.resize((size, size), Image.Resampling.BICUBIC)
    return np.array(image, dtype=np.uint8)


def patchify(images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Qwen2-VL patches for a batch of square images.

    images: uint8 [batch, size, size, 3], size a multiple of 28 px.
    Returns pixel_values [batch * grid**2, 3 * TEMPORAL_PATCH_SIZE * PATCH_SIZE**2] (the
    processor's layout: merge-unit-major, channel, time, row, column) and image_grid_thw
    [batch, 3] = (1, grid, grid), grid = size // PATCH_SIZE.
    """
    batch, height, width = images.shape[:3]
    if height != width:
        raise UserInputError(f"patchify needs square images, got {height} x {width}")
    grid = check_image_size(height) // PATCH_SIZE
    pixels = images.permute(0, 3, 1, 2).float() / 255.0
    pixels = (pixels - _MEAN) / _STD  # [batch, 3, H, W]
    pixels = pixels.reshape(
        batch, 3, grid // MERGE_SIZE, MERGE_SIZE, PATCH_SIZE, grid // MERGE_SIZE, MERGE_SIZE, PATCH_SIZE
    )
    # -> [batch, rows/m, cols/m, m, m, channel, patch_row, patch_col]
    pixels = pixels.permute(0, 2, 5, 3, 6, 1, 4, 7)
    pixels = pixels.unsqueeze(6).expand(*pixels.shape[:6], TEMPORAL_PATCH_SIZE, PATCH_SIZE, PATCH_SIZE)
    pixel_values = pixels.reshape(batch * grid * grid, 3 * TEMPORAL_PATCH_SIZE * PATCH_SIZE * PATCH_SIZE)
    image_grid_thw = torch.tensor([[1, grid, grid]], dtype=torch.long).repeat(batch, 1)
    return pixel_values, image_grid_thw


@dataclass
class EncodedExample:
    """One training example: prompt + answer token ids; labels are IGNORE_INDEX except on
    the answer tokens (and the closing <|im_end|>, so the model learns to stop)."""

    input_ids: list[int]
    labels: list[int]
    image_index: int


def encode_example(
    processor, question: str, answer: str, image_index: int, question_first: bool = False
) -> EncodedExample:
    """Chat-format `question` about one image and append `answer` + <|im_end|>. The user turn
    is the image, then the question; `question_first`: the question, then the image (so under
    causal attention the image tokens can attend to the question)."""
    tokenizer = processor.tokenizer
    prompt = processor.apply_chat_template(
        chat_messages(question, 1, text_first=question_first), add_generation_prompt=True
    )
    # Expand the single <|image_pad|> to one token per merged patch, as the processor does.
    n_image_tokens = (image_size_of(processor) // CELL) ** 2
    prompt = prompt.replace(processor.image_token, processor.image_token * n_image_tokens)
    prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    answer_ids = tokenizer(answer, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    if tokenizer.unk_token_id in prompt_ids + answer_ids:
        raise UserInputError(f"words outside the vocabulary in {question!r} -> {answer!r}")
    return EncodedExample(
        input_ids=prompt_ids + answer_ids,
        labels=[IGNORE_INDEX] * len(prompt_ids) + answer_ids,
        image_index=image_index,
    )


def collate_text(
    examples: list[EncodedExample], pad_id: int, image_token_id: int, grid: int
) -> dict[str, torch.Tensor]:
    """The token side of a right-padded batch (one image of grid x grid merged tokens per
    example): input_ids / attention_mask / labels / mm_token_type_ids [batch, max_len] and
    image_grid_thw [batch, 3]. mm_token_type_ids (1 at image tokens, as the processor makes
    it) is what makes HF compute M-RoPE's 2-D image positions; without it the model silently
    falls back to 1-D positions."""
    length = max(len(example.input_ids) for example in examples)
    input_ids = torch.full((len(examples), length), pad_id, dtype=torch.long)
    labels = torch.full((len(examples), length), IGNORE_INDEX, dtype=torch.long)
    attention_mask = torch.zeros((len(examples), length), dtype=torch.long)
    for row, example in enumerate(examples):
        n = len(example.input_ids)
        input_ids[row, :n] = torch.tensor(example.input_ids)
        labels[row, :n] = torch.tensor(example.labels)
        attention_mask[row, :n] = 1
    side = int(round(grid**0.5)) * MERGE_SIZE  # patches per side
    return {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "mm_token_type_ids": (input_ids == image_token_id).long(),
        "labels": labels,
        "image_grid_thw": torch.tensor([[1, side, side]], dtype=torch.long).repeat(len(examples), 1),
    }


def collate(
    examples: list[EncodedExample], images, pad_id: int, image_token_id: int
) -> dict[str, torch.Tensor]:
    """Right-padded batch for `Qwen2_5_VLForConditionalGeneration.forward`: `collate_text`
    plus pixel_values of the examples' images.

    images: uint8 [n_images, size, size, 3] (a tensor or an ImageStore), indexed by
    example.image_index.
    """
    image_rows = [example.image_index for example in examples]
    pixel_values, image_grid_thw = patchify(images[image_rows])
    grid = int(image_grid_thw[0, 1]) // MERGE_SIZE
    batch = collate_text(examples, pad_id, image_token_id, grid * grid)
    return {**batch, "pixel_values": pixel_values, "image_grid_thw": image_grid_thw}

"""The embedded model's processor: Qwen2.5-VL's processor over our word-level tokenizer
and the PIL image processor (no torchvision needed).

Every square image is resized to a fixed size: the recipe's default
IMAGE_SIZE = 224 px, i.e. 16 x 16 patches of 14 px, merged 2 x 2 into an 8 x 8 grid = 64
image tokens. A recipe stage may choose another multiple of 28 px (`--image-size`); the
folder's image-processor config records it, and `image_size_of` reads it back (the shipped
model's size is its folder's, not this constant).

The pixel budget is pinned to (S - 14)^2 .. (S + 14)^2 around S^2 rather than to exactly S^2:
HF's `smart_resize` computes the target side in floating point, and with an exact budget
about one square input size in ten (e.g. 300 px for S = 224) lands one 28-px cell off
(196 or 252 px: another token grid than the model was trained on). With the half-cell
slack every square input becomes S x S. Non-square inputs keep their aspect ratio (Qwen's
rule), so they get another grid.
"""

from __future__ import annotations

import json
from pathlib import Path

from transformers import AutoImageProcessor, AutoProcessor, AutoTokenizer, Qwen2_5_VLProcessor
from transformers.image_utils import OPENAI_CLIP_MEAN, OPENAI_CLIP_STD
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

from vlens.utils.errors import UserInputError
from vlens.zoo.image_sizes import CELL, MERGE_SIZE, PATCH_SIZE, pixel_budget, processor_image_size

IMAGE_SIZE = 224
TEMPORAL_PATCH_SIZE = 2
MERGED_GRID = IMAGE_SIZE // (PATCH_SIZE * MERGE_SIZE)  # 8: rows and columns of image tokens


def check_image_size(image_size: int) -> int:
    """`image_size` if it is a positive multiple of CELL (28 px), else a ValueError."""
    if image_size < CELL or image_size % CELL:
        raise UserInputError(
            f"image size {image_size} px must be a positive multiple of {CELL} px "
            f"({PATCH_SIZE} px patches merged {MERGE_SIZE} x {MERGE_SIZE}), e.g. 168 or 224"
        )
    return image_size


def build_image_processor(image_size: int = IMAGE_SIZE) -> Qwen2VLImageProcessorPil:
    """Qwen2-VL's PIL image processor that resizes square images to image_size px."""
    check_image_size(image_size)
    min_pixels, max_pixels = pixel_budget(image_size)
    return Qwen2VLImageProcessorPil(
        min_pixels=min_pixels,
        max_pixels=max_pixels,
        patch_size=PATCH_SIZE,
        merge_size=MERGE_SIZE,
        temporal_patch_size=TEMPORAL_PATCH_SIZE,
    )


def image_size_of(processor) -> int:
    """The square input size (px) a processor (or its image processor) pins images to."""
    image_processor = getattr(processor, "image_processor", processor)
    size = processor_image_size(image_processor)
    if size is None:
        raise UserInputError(f"image processor does not pin a square size: {image_processor.size}")
    return size


def save_processor_files(tokenizer, image_processor: Qwen2VLImageProcessorPil, folder: str | Path) -> None:
    """Write tokenizer, image-processor, video-processor and processor configs into `folder`
    so that `AutoProcessor.from_pretrained(folder)` resolves to `Qwen2_5_VLProcessor`."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(folder)
    image_processor.save_pretrained(folder)
    config = json.loads((folder / "preprocessor_config.json").read_text())
    config["processor_class"] = "Qwen2_5_VLProcessor"
    (folder / "preprocessor_config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    # Where torchvision is installed, transformers also builds Qwen's video processor; give
    # it the same geometry so it never falls back to the 7B defaults.
    min_pixels, max_pixels = pixel_budget(image_size_of(image_processor))
    video_config = {
        "video_processor_type": "Qwen2VLVideoProcessor",
        "processor_class": "Qwen2_5_VLProcessor",
        "size": {"shortest_edge": min_pixels, "longest_edge": max_pixels},
        "patch_size": PATCH_SIZE,
        "temporal_patch_size": TEMPORAL_PATCH_SIZE,
        "merge_size": MERGE_SIZE,
        "image_mean": list(OPENAI_CLIP_MEAN),
        "image_std": list(OPENAI_CLIP_STD),
        "do_convert_rgb": True,
        "do_normalize": True,
        "do_rescale": True,
        "do_resize": True,
        "rescale_factor": 1 / 255,
    }
    (folder / "video_preprocessor_config.json").write_text(json.dumps(video_config, indent=2) + "\n")
    (folder / "processor_config.json").write_text(
        json.dumps({"processor_class": "Qwen2_5_VLProcessor"}) + "\n"
    )


def assemble_processor(tokenizer, image_processor) -> Qwen2_5_VLProcessor:
    """A `Qwen2_5_VLProcessor` over `tokenizer` and `image_processor`, without a video
    processor.

    transformers (5.x) insists on a video processor, whose only implementation needs
    torchvision. Images never touch it, so where torchvision is missing we fill in the
    attributes `Qwen2_5_VLProcessor.__init__` would set, minus the video processor.
    """
    processor = Qwen2_5_VLProcessor.__new__(Qwen2_5_VLProcessor)
    processor.chat_template = tokenizer.chat_template
    processor.tokenizer = tokenizer
    processor.image_processor = image_processor
    processor.video_processor = None
    processor.image_token = "<|image_pad|>"
    processor.video_token = "<|video_pad|>"
    processor.image_token_id = tokenizer.convert_tokens_to_ids(processor.image_token)
    processor.video_token_id = tokenizer.convert_tokens_to_ids(processor.video_token)
    return processor


def load_processor(folder: str | Path) -> Qwen2_5_VLProcessor:
    """`AutoProcessor.from_pretrained(folder)` where it works (torchvision installed);
    otherwise the same processor assembled from the folder's tokenizer and PIL image
    processor (images only)."""
    try:
        return AutoProcessor.from_pretrained(folder)
    except ImportError:
        tokenizer = AutoTokenizer.from_pretrained(folder)
        image_processor = AutoImageProcessor.from_pretrained(folder)
        return assemble_processor(tokenizer, image_processor)

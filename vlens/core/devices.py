"""Default devices and dtypes, and the processor's image resolution, for loading real checkpoints.

The defaults every loader and command share: the device is ``cuda`` when one is available,
else ``cpu``; the dtype is bfloat16 on a GPU that supports it (float16 on one that does not)
and float32 on the CPU. A dtype may be given as a `torch.dtype` or a name
("bfloat16"/"bf16", "float16"/"fp16"/"half", "float32"/"fp32"/"float", "auto"). Bad names and
settings raise `vlens.utils.errors.UserInputError` (a ValueError).
"""

from __future__ import annotations

from typing import Any

import torch

from vlens.utils.errors import UserInputError

DTYPE_NAMES: dict[str, torch.dtype] = {
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "float16": torch.float16, "fp16": torch.float16, "half": torch.float16,
    "float32": torch.float32, "fp32": torch.float32, "float": torch.float32,
}


def resolve_device(device: str | torch.device | None = None) -> torch.device:
    """`device`, or ``cuda`` when available, else ``cpu``. A CUDA device without CUDA is an error."""
    if device is None or str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        raise UserInputError(f"device {device!r} is not a torch device; use e.g. cpu, cuda or cuda:1") from None
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise UserInputError(f"device {str(device)!r} was asked for but this machine has no CUDA device; "
                         "use --device cpu (or leave it out: cuda when available, else cpu)")
    if resolved.type == "cuda" and resolved.index is not None and resolved.index >= torch.cuda.device_count():
        raise UserInputError(f"device {str(device)!r}: this machine has {torch.cuda.device_count()} CUDA device(s) "
                             f"(cuda:0 .. cuda:{torch.cuda.device_count() - 1})")
    return resolved


def resolve_dtype(dtype: str | torch.dtype | None = None, device: str | torch.device | None = None) -> torch.dtype:
    """`dtype` (a torch dtype or a name), or the default for `device`: bf16 on GPU, fp32 on CPU."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype is None or dtype == "auto":
        target = resolve_device(device)
        if target.type == "cuda":
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return torch.float32
    name = str(dtype).lower().removeprefix("torch.")
    if name not in DTYPE_NAMES:
        raise UserInputError(f"unknown dtype {dtype!r}: use one of bfloat16, float16, float32 (or bf16, fp16, fp32, auto)")
    return DTYPE_NAMES[name]


def configure_resolution(processor: Any, min_pixels: int | None = None, max_pixels: int | None = None,
                         image_size: int | None = None) -> Any:
    """Set the image resolution a processor resizes to, in place (returns the processor).

    Qwen-VL processors resize each image to a pixel count in [min_pixels, max_pixels] (a multiple
    of 28 x 28 per merged token); `image_size` fixes a square side instead (min = max = side^2).
    CLIP-style processors (LLaVA) take `image_size` as their resize and crop side, fixed-size ones
    (Gemma 3) as their height and width; their tower has one input size, so other sizes fail in the
    model (Gemma 3: with a message naming it). Anyres processors
    (LLaVA-NeXT, LLaVA-OneVision: `image_grid_pinpoints`) cut each image into tiles of the tower's
    side at one of the pinpoint resolutions; `image_size` is the largest resolution they may use:
    only the pinpoints whose height and width are both <= image_size are kept (at least one tile
    side), which bounds the tiles, and so the image tokens, of every image. The model reads the
    pinpoints too: call `sync_resolution(hf_model, processor)` after this. Dynamic-tile processors
    (InternVL: `crop_to_patches`; Llama 4's best-fit canvas) keep the tower's tile side and use at most (image_size // tile)^2
    tiles; split-image processors (Idefics3 / SmolVLM: `max_image_size`) resize every image to
    image_size on its longest edge before cutting it into sub-images of the tower's side; Idefics2's
    (`shortest_edge` / `longest_edge`) resize each image and crop to at most image_size on its longest edge;
    Pixtral's (`longest_edge` only: Mistral 3) resize each image to at most image_size on its longest edge;
    Molmo 2's (`max_crops`) and Phi-4-multimodal's (`dynamic_hd`) keep the crop side and use at most
    (image_size // crop)^2 crops;
    LFM2-VL's (`max_image_tokens`, `tile_size`) resize a whole image (or thumbnail) to at most image_size^2 pixels
    and cut tiles of the tower's side only while image_size holds at least two (at most (image_size // tile)^2).
    """
    image_processor = getattr(processor, "image_processor", processor)
    if image_size is not None:
        if image_size < 1:
            raise UserInputError(f"image_size must be >= 1 px, got {image_size}")
        if min_pixels is not None or max_pixels is not None:
            raise UserInputError("give image_size or min_pixels / max_pixels, not both")
    for name, value in (("min_pixels", min_pixels), ("max_pixels", max_pixels)):
        if value is not None and value < 1:
            raise UserInputError(f"{name} must be >= 1, got {value}")
    if min_pixels is not None and max_pixels is not None and min_pixels > max_pixels:
        raise UserInputError(f"min_pixels ({min_pixels}) is larger than max_pixels ({max_pixels})")
    if hasattr(image_processor, "min_pixels") or hasattr(image_processor, "merge_size"):  # Qwen-VL family
        factor = int(getattr(image_processor, "patch_size", 14)) * int(getattr(image_processor, "merge_size", 1))
        if image_size is not None and image_size % factor:  # Qwen would round it to another size silently
            nearest = max(factor, round(image_size / factor) * factor)
            raise UserInputError(f"image_size {image_size} px is not a multiple of {factor} (this model's patch x "
                                 f"merge size); use e.g. {nearest}")
        low = image_size * image_size if image_size is not None else min_pixels
        high = image_size * image_size if image_size is not None else max_pixels
        size = {k: v for k, v in dict(getattr(image_processor, "size", None) or {}).items() if v is not None}
        if low is not None:
            size["shortest_edge"] = low
        if high is not None:
            size["longest_edge"] = high
            size["shortest_edge"] = min(size.get("shortest_edge", high), high)
        if low is not None and "longest_edge" in size:
            size["longest_edge"] = max(size["longest_edge"], low)
        size = {k: size[k] for k in ("shortest_edge", "longest_edge") if k in size}
        image_processor.size = size
        if hasattr(image_processor, "min_pixels"):  # transformers < 5 reads these attributes
            image_processor.min_pixels, image_processor.max_pixels = size["shortest_edge"], size["longest_edge"]
        return processor
    if min_pixels is not None or max_pixels is not None:
        raise UserInputError(f"{type(image_processor).__name__} has no pixel budget (min_pixels/max_pixels are Qwen-VL "
                         "settings); use image_size")
    if image_size is not None and hasattr(image_processor, "resize_to_max_canvas") and hasattr(image_processor,
                                                                                          "max_patches"):
        # Llama 4's best-fit canvas of tiles: the tile side is the tower's; image_size bounds the canvas's tiles
        tile = int(_size_value(image_processor.size, "height"))
        if image_size < tile:
            raise UserInputError(f"image_size {image_size} px is smaller than one tile ({tile} px) of this tiling "
                                 f"processor: use at least {tile}")
        image_processor.max_patches = max(1, (image_size // tile) ** 2)
        return processor
    if image_size is not None and hasattr(image_processor, "crop_to_patches") and hasattr(image_processor, "max_patches"):
        # dynamic tiles (InternVL): the tile side is the tower's; image_size bounds the tiles an image may use
        tile = int(_size_value(getattr(image_processor, "size", None), "height") or 0)
        if image_size < tile:
            raise UserInputError(f"image_size {image_size} px is smaller than one tile ({tile} px) of this tiling "
                                 f"processor: use at least {tile}")
        image_processor.max_patches = max(1, (image_size // tile) ** 2) if tile else image_processor.max_patches
        image_processor.min_patches = min(int(getattr(image_processor, "min_patches", 1)), image_processor.max_patches)
        return processor
    if image_size is not None and hasattr(image_processor, "dynamic_hd"):
        # Phi-4-multimodal: HD crops keep the tower's side; image_size bounds how many an image may use
        crop = int(_size_value(image_processor.size, "height") if not isinstance(image_processor.size, int)
                   else image_processor.size)
        if image_size < crop:
            raise UserInputError(f"image_size {image_size} px is smaller than one crop ({crop} px) of this "
                                 f"processor: use at least {crop}")
        image_processor.dynamic_hd = max(1, (image_size // crop) ** 2)
        return processor
    if image_size is not None and hasattr(image_processor, "max_crops") and hasattr(image_processor, "overlap_margins"):
        # Molmo 2: crops keep the tower's side; image_size bounds how many an image may use
        crop = int(image_processor.size)
        if image_size < crop:
            raise UserInputError(f"image_size {image_size} px is smaller than one crop ({crop} px) of this "
                                 f"processor: use at least {crop}")
        image_processor.max_crops = max(1, (image_size // crop) ** 2)
        return processor
    if image_size is not None and hasattr(image_processor, "max_image_tokens") and hasattr(image_processor, "tile_size"):
        # LFM2-VL: a token budget for the whole-image resize (image_size^2 px) and tiles of the tower's side only
        # while image_size holds two of them
        step = int(image_processor.encoder_patch_size) * int(image_processor.downsample_factor)
        if image_size % step:
            raise UserInputError(f"image_size {image_size} px is not a multiple of {step} (this model's patch x "
                                 f"downsample factor); use e.g. {max(step, round(image_size / step) * step)}")
        image_processor.max_image_tokens = (image_size // step) ** 2
        image_processor.min_image_tokens = min(int(image_processor.min_image_tokens), image_processor.max_image_tokens)
        tiles = (image_size // int(image_processor.tile_size)) ** 2
        image_processor.do_image_splitting = tiles >= 2
        if tiles >= 2:
            image_processor.max_tiles = tiles
            image_processor.min_tiles = min(int(image_processor.min_tiles), tiles)
        return processor
    if image_size is not None and hasattr(image_processor, "max_image_size") and hasattr(image_processor,
                                                                                         "do_image_splitting"):
        # split images (Idefics3 / SmolVLM): images are resized to this longest edge, then cut into sub-images
        image_processor.size = {"longest_edge": image_size}
        return processor
    if image_size is not None and hasattr(image_processor, "do_image_splitting") and \
            _size_keys(getattr(image_processor, "size", None)) >= {"shortest_edge", "longest_edge"}:
        # Idefics2: each image (and crop) is resized to at most image_size on its longest edge
        shortest = int(_size_value(image_processor.size, "shortest_edge"))
        image_processor.size = {"shortest_edge": min(shortest, image_size), "longest_edge": image_size}
        return processor
    if image_size is not None and _size_keys(getattr(image_processor, "size", None)) == {"longest_edge"}:
        # Pixtral (Mistral 3): each image resized to at most image_size on its longest edge, aspect kept
        image_processor.size = {"longest_edge": image_size}
        return processor
    pinpoints = getattr(image_processor, "image_grid_pinpoints", None)
    if pinpoints and image_size is not None:  # anyres (LLaVA-NeXT / OneVision): a resolution budget
        kept = [list(p) for p in pinpoints if max(int(p[0]), int(p[1])) <= image_size]
        if not kept:
            smallest = min(max(int(p[0]), int(p[1])) for p in pinpoints)
            raise UserInputError(f"image_size {image_size} px is smaller than every tiling resolution of this anyres "
                                 f"processor (image_grid_pinpoints {[list(p) for p in pinpoints]}): use at least "
                                 f"{smallest}, the side of its smallest resolution")
        image_processor.image_grid_pinpoints = kept
        return processor
    if image_size is not None:
        if _size_keys(getattr(image_processor, "size", None)) >= {"height", "width"} and not getattr(image_processor, "do_center_crop", False):
            image_processor.size = {"height": image_size, "width": image_size}  # a fixed resize (Gemma 3)
        else:
            image_processor.size = {"shortest_edge": image_size}
            image_processor.crop_size = {"height": image_size, "width": image_size}
    return processor


def sync_resolution(hf_model: Any, processor: Any) -> None:
    """Give an anyres model (its config's `image_grid_pinpoints`) the processor's pinpoints, which HF's
    forward reads to find each image's tiles; a no-op for other models."""
    image_processor = getattr(processor, "image_processor", processor)
    pinpoints = getattr(image_processor, "image_grid_pinpoints", None)
    config: Any = getattr(hf_model, "config", None)
    if pinpoints and config is not None and getattr(config, "image_grid_pinpoints", None) is not None:
        config.image_grid_pinpoints = [list(p) for p in pinpoints]


def _size_value(size: Any, key: str) -> Any:
    """One entry of an image processor's `size` (a dict or HF's SizeDict), None when unset."""
    if size is None:
        return None
    return size.get(key) if isinstance(size, dict) else getattr(size, key, None)


def _size_keys(size: Any) -> set[str]:
    """The keys an image processor's `size` sets (a dict or HF's SizeDict)."""
    if size is None:
        return set()
    items = size.items() if isinstance(size, dict) else vars(size).items()
    return {key for key, value in items if value is not None}

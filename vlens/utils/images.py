"""Images in, 8-bit RGB out, with the right scaling for every input kind, or a clear error.

PIL's ``convert("RGB")`` clips 16-bit and float images instead of scaling them (a 16-bit
scan becomes white, a float image in [0, 1] black), drops alpha without compositing (a
transparent background turns black), and HF processors rescale float arrays by 1/255 a second
time. `to_rgb` does what the pixels mean:

| input | result |
|---|---|
| PIL "RGB", "L", "1", "CMYK", "YCbCr", "LAB", "HSV" | PIL's conversion |
| PIL with alpha ("RGBA", "LA", "PA", "P" with transparency, "RGBa", "La") | composited over white |
| PIL "I;16*" (16-bit) | values / 257 (65535 -> 255) |
| PIL "I" (32-bit int) | read as 16-bit when every value lies in [0, 65535], else refused |
| PIL "F" (float) | values * 255 when every value lies in [0, 1], else refused |
| numpy array / torch tensor, HW, HWC or CHW | uint8 as is; uint16 / 257; float in [0, 1] * 255; other dtypes refused |
| str / Path | a local regular file (no FIFO, device or folder; at most `MAX_IMAGE_BYTES`), turned upright by its EXIF orientation (`upright`, as transformers' ``load_image`` does), then as above |
| "http://...", "https://..." | refused unless ``allow_urls=True`` (then fetched by HF's ``load_image``) |
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageOps

from vlens.utils.errors import UserInputError

MAX_IMAGE_BYTES = 256 * 2**20  # larger files are refused before they are read
SOURCE_KEY = "vlens_source"  # image.info[SOURCE_KEY]: the file an opened image came from (errors name it)
_URL_SCHEMES = ("http://", "https://", "ftp://", "data:")
_ALPHA_MODES = ("RGBA", "LA", "PA", "RGBa", "La")
_DIRECT_MODES = ("RGB", "L", "1", "CMYK", "YCbCr", "LAB", "HSV")


def _from_gray(values: np.ndarray) -> Image.Image:
    return Image.fromarray(values.astype(np.uint8), mode="L").convert("RGB")


def _scaled_uint8(values: np.ndarray, what: str) -> np.ndarray:
    """uint8 from uint8 / uint16 / bool / float-in-[0, 1] values; anything else is refused."""
    if values.dtype == np.uint8:
        return values
    if values.dtype == bool:
        return values.astype(np.uint8) * 255
    if values.dtype == np.uint16:
        return np.round(values.astype(np.float64) / 257.0).astype(np.uint8)
    if np.issubdtype(values.dtype, np.floating):
        if not np.isfinite(values).all():
            raise UserInputError(f"{what}: the float image holds NaN or inf values")
        low, high = float(values.min(initial=0.0)), float(values.max(initial=0.0))
        if low < 0.0 or high > 1.0:
            raise UserInputError(f"{what}: a float image must hold values in [0, 1] (they are scaled by 255), got "
                                 f"[{low:g}, {high:g}]; scale it to [0, 1] or pass 8-bit (uint8) pixels")
        return np.round(values * 255.0).astype(np.uint8)
    if np.issubdtype(values.dtype, np.integer):
        raise UserInputError(f"{what}: integer pixels of dtype {values.dtype} are ambiguous; pass uint8 (0..255), "
                             "uint16 (0..65535) or float values in [0, 1]")
    raise UserInputError(f"{what}: cannot read pixels of dtype {values.dtype} as an image")


def _pil_to_rgb(image: Image.Image, what: str) -> Image.Image:
    mode = image.mode
    if mode == "RGB":
        return image
    if mode == "P":
        image = image.convert("RGBA" if "transparency" in image.info else "RGB")
        mode = image.mode
        if mode == "RGB":
            return image
    if mode in _ALPHA_MODES:
        rgba = image.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(background, rgba).convert("RGB")
    if mode in _DIRECT_MODES:
        return image.convert("RGB")
    if mode.startswith("I;16"):
        return _from_gray(_scaled_uint8(np.asarray(image).astype(np.uint16), what))
    if mode == "I":
        values = np.asarray(image)
        low, high = int(values.min(initial=0)), int(values.max(initial=0))
        if low < 0 or high > 65535:
            raise UserInputError(f"{what}: a 32-bit integer image (PIL mode 'I') is read as 16-bit, but its values "
                                 f"span [{low}, {high}]; convert it to 8-bit RGB yourself")
        return _from_gray(_scaled_uint8(values.astype(np.uint16), what))
    if mode == "F":
        return _from_gray(_scaled_uint8(np.asarray(image, dtype=np.float32), what))
    raise UserInputError(f"{what}: PIL image mode {mode!r} is not supported; convert it to 'RGB' first")


def _array_to_rgb(values: Any, what: str) -> Image.Image:
    if hasattr(values, "detach"):  # a torch tensor
        values = values.detach().cpu().numpy()
    values = np.asarray(values)
    if values.ndim == 3 and values.shape[0] in (1, 3, 4) and values.shape[-1] not in (1, 3, 4):
        values = values.transpose(1, 2, 0)  # CHW -> HWC
    if values.ndim == 3 and values.shape[-1] == 1:
        values = values[..., 0]
    if values.ndim not in (2, 3) or (values.ndim == 3 and values.shape[-1] not in (3, 4)):
        raise UserInputError(f"{what}: an array image must be [H, W], [H, W, 3/4] or [3/4, H, W], got shape "
                             f"{tuple(values.shape)}")
    pixels = _scaled_uint8(values, what)
    if pixels.ndim == 2:
        return _from_gray(pixels)
    return _pil_to_rgb(Image.fromarray(pixels, mode="RGBA" if pixels.shape[-1] == 4 else "RGB"), what)


def with_source(image: Image.Image, source: str) -> Image.Image:
    """`image`, its ``info`` noting the file it came from (kept through PIL's conversions)."""
    image.info[SOURCE_KEY] = source
    return image


def upright(image: Image.Image) -> Image.Image:
    """The image as it is meant to be seen: rotated / mirrored by its EXIF orientation tag (a phone
    photo is stored sideways with a tag saying so), as transformers' ``load_image`` does
    (``PIL.ImageOps.exif_transpose``); an image without the tag is returned as it is."""
    try:
        orientation = image.getexif().get(0x0112, 1)
    except (OSError, SyntaxError, ValueError):  # an unreadable EXIF block: the pixels are still the image
        return image
    if orientation in (None, 1):
        return image
    return ImageOps.exif_transpose(image)


def open_image_file(path: str | os.PathLike, what: str | None = None) -> Image.Image:
    """A local image file as 8-bit RGB: only a regular file of at most `MAX_IMAGE_BYTES` is opened
    (a FIFO would block forever, a device never ends)."""
    path = Path(path)
    what = what or str(path)
    try:
        info = path.stat()
    except FileNotFoundError:
        raise FileNotFoundError(f"{what}: no such image file") from None
    if not stat.S_ISREG(info.st_mode):
        raise UserInputError(f"{what}: not a regular file (a folder, FIFO or device); give an image file")
    if info.st_size > MAX_IMAGE_BYTES:
        raise UserInputError(f"{what}: {info.st_size / 2**20:.0f} MiB is more than the {MAX_IMAGE_BYTES // 2**20} MiB "
                             "allowed for one image file")
    try:
        with Image.open(path) as image:
            image.load()
            return with_source(_pil_to_rgb(upright(image), what), str(path))
    except (OSError, Image.DecompressionBombError, SyntaxError) as err:
        raise UserInputError(f"{what}: cannot decode the image ({err})") from None


def is_url(source: Any) -> bool:
    return isinstance(source, str) and source.strip().lower().startswith(_URL_SCHEMES)


def to_rgb(image: Any, allow_urls: bool = False, what: str = "image") -> Image.Image:
    """An image of any supported kind (see the module docstring) as an 8-bit RGB PIL image."""
    if isinstance(image, Image.Image):
        return _pil_to_rgb(image, what)
    if is_url(image):
        if not allow_urls:
            raise UserInputError(f"{what}: {image[:80]!r} is a URL; vlens does not fetch images from the network "
                                 "unless asked: pass allow_urls=True, or download it and pass the file or PIL image")
        from transformers.image_utils import load_image

        return _pil_to_rgb(load_image(image), what)
    if isinstance(image, str | os.PathLike):
        return open_image_file(image, what=f"{what} {image}")
    if isinstance(image, np.ndarray) or hasattr(image, "detach"):
        return _array_to_rgb(image, what)
    raise UserInputError(f"{what}: cannot use a {type(image).__name__} as an image; pass a PIL image, a file path, "
                         "or a numpy array / torch tensor")


__all__ = ["MAX_IMAGE_BYTES", "SOURCE_KEY", "is_url", "open_image_file", "to_rgb", "upright", "with_source"]

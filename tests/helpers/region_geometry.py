"""Hand-computed preprocessing geometry shared by the tests of image regions and L_focus centres."""

from __future__ import annotations

import math


def smart_resize_by_hand(height: int, width: int, factor: int = 28, min_pixels: int = 56 * 56,
                         max_pixels: int = 28 * 28 * 64) -> tuple[int, int]:
    """Qwen-VL's smart_resize, written out: (height, width) rounded to multiples of `factor`, scaled to
    stay within [min_pixels, max_pixels]."""
    h, w = round(height / factor) * factor, round(width / factor) * factor
    if h * w > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h, w = math.floor(height / beta / factor) * factor, math.floor(width / beta / factor) * factor
    elif h * w < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h, w = math.ceil(height * beta / factor) * factor, math.ceil(width * beta / factor) * factor
    return h, w

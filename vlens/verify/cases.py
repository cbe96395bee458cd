"""The built-in inputs of `vlens verify`: deterministic images (no download) and short prompts."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import numpy as np
from PIL import Image

PROMPT = "How many dots are there?"


def pattern_image(width: int, height: int, seed: int) -> Image.Image:
    """A deterministic RGB image: smooth gradients plus a few coloured discs (a random-looking but
    natural-statistics picture, so a processor's resizing does something realistic)."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    base = np.stack([x / max(width - 1, 1), y / max(height - 1, 1), 0.5 + 0.5 * np.sin((x + y) / 9.0)], -1) * 200
    for _ in range(4):
        cx, cy, r = rng.uniform(0, width), rng.uniform(0, height), rng.uniform(4, max(5, min(width, height) / 5))
        disc = (x - cx) ** 2 + (y - cy) ** 2 < r**2
        base[disc] = rng.uniform(0, 255, size=3)
    return Image.fromarray(base.clip(0, 255).astype(np.uint8))


def takes_video(model: Any) -> str | None:
    """None when the model takes video here, else the reason it is skipped."""
    if getattr(model.cfg, "video_token_id", None) is None:
        return "the family has no video token"
    if "videos" not in inspect.signature(model.prepare).parameters:
        return "model.prepare takes no videos in this vlens version"
    if not model.adapter.takes_video():
        return f"vlens runs no video on the {model.adapter.family} family (docs/video.md lists those it does)"
    return None


def cases(model: Any) -> dict[str, Callable[[], Any] | str]:
    """name -> a function building the case's `VLMInputs`, or the reason the case is skipped."""
    images = [pattern_image(w, h, seed) for seed, (w, h) in enumerate([(224, 168), (160, 200), (200, 200),
                                                                        (176, 144), (120, 120)], start=1)]
    built: dict[str, Callable[[], Any] | str] = {
        "one_image": lambda: model.prepare(images=[images[0]], prompts=[PROMPT]),
        "two_images": lambda: model.prepare(images=[[images[1], images[2]]], prompts=["Which image has more dots?"]),
        "text_only": lambda: model.prepare(prompts=[PROMPT]),
        "padded_batch": lambda: model.prepare(images=[images[3], images[4]], prompts=[PROMPT, "red"]),
    }
    why = takes_video(model)
    if why is None:
        frames = [pattern_image(112, 112, 10 + i) for i in range(4)]
        built["video"] = lambda: model.prepare(videos=[frames], prompts=["What happens in the video?"])
    else:
        built["video"] = why
    return built

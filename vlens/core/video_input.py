"""What `model.prepare(videos=...)` accepts, normalised to lists of RGB PIL frames.

A video is a list (or tuple) of frames, each a PIL image, a file path or an [H, W, 3] / [H, W] array,
or one array / tensor [T, H, W, 3] (uint8 0..255 or float 0..1, as `vlens.utils.images.to_rgb` reads
an image). `videos=` takes one entry per prompt: a video, a list of videos, or None.
"""

from __future__ import annotations

from typing import Any

from PIL import Image

from vlens.utils.errors import UserInputError
from vlens.utils.images import to_rgb


def _is_array(value: Any) -> bool:
    return hasattr(value, "ndim") and hasattr(value, "shape") and not isinstance(value, Image.Image)


def is_video(value: Any) -> bool:
    """A 4-D array / tensor, or a list / tuple of frames (not of videos)."""
    if _is_array(value):
        return value.ndim == 4
    return isinstance(value, (list, tuple)) and len(value) > 0 and not any(is_video(v) for v in value)


def video_frames(video: Any, allow_urls: bool = False, what: str = "video") -> list[Image.Image]:
    """One video as RGB PIL frames of one size."""
    if _is_array(video):
        if video.ndim != 4:
            raise UserInputError(f"{what}: an array video must be [frames, height, width, 3], got shape "
                                 f"{tuple(video.shape)}")
        items = [video[k] for k in range(video.shape[0])]
    elif isinstance(video, (list, tuple)):
        items = list(video)
    else:
        raise UserInputError(f"{what}: a video is a list of frames (PIL images, paths or [H, W, 3] arrays) or an "
                             f"array [frames, H, W, 3], got {type(video).__name__}")
    if not items:
        raise UserInputError(f"{what} has no frames")
    frames = [to_rgb(item, allow_urls=allow_urls, what=f"frame {k} of {what}") for k, item in enumerate(items)]
    sizes = sorted({frame.size for frame in frames})
    if len(sizes) > 1:
        raise UserInputError(f"{what}: its frames have different sizes {sizes[:4]}: give every frame one size")
    return frames


def videos_per_row(videos: Any, batch: int, allow_urls: bool = False) -> list[list[list[Image.Image]]]:
    """Per prompt, its videos (each a list of RGB frames)."""
    if videos is None:
        return [[] for _ in range(batch)]
    if batch == 1 and not (isinstance(videos, (list, tuple)) and len(videos) == 1):
        videos = [videos]  # one prompt: the entry itself
    if not isinstance(videos, (list, tuple)) or len(videos) != batch:
        count = len(videos) if isinstance(videos, (list, tuple)) else 1
        raise UserInputError(f"Got {count} video entries for {batch} prompts. Give one entry per prompt: a "
                             "video (a list of frames or a [frames, H, W, 3] array), a list of videos, or None.")
    rows: list[list[list[Image.Image]]] = []
    for p, entry in enumerate(videos):
        if entry is None:
            rows.append([])
        elif is_video(entry) or _is_array(entry):
            rows.append([video_frames(entry, allow_urls, f"the video of prompt {p}")])
        elif isinstance(entry, (list, tuple)):
            rows.append([video_frames(v, allow_urls, f"video {k} of prompt {p}") for k, v in enumerate(entry)])
        else:
            raise UserInputError(f"videos entry {p}: a video is a list of frames or a [frames, H, W, 3] array, got "
                                 f"{type(entry).__name__}")
    return rows

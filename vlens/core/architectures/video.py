"""Video inputs made from the family's own image processor (HF's video processors need torchvision).

A video reaches an adapter as a list of RGB PIL frames of one size (`model.prepare(videos=...)`).
Qwen-VL's vision tower reads a video as temporal patches of `temporal_patch_size` frames: its image
processor already writes every patch as [C, T, P, P] with the one image repeated T times, so the
frames are processed as images (the same resize, rescale and normalisation) and each patch's T slots
are filled from T consecutive frames, in the video processor's layout (docs/video.md).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from PIL import Image
from torch import Tensor

from vlens.core.architectures.base import ImageTile
from vlens.utils.errors import UserInputError


def pad_frames(frames: list[Any], multiple: int) -> list[Any]:
    """The frames, the last one repeated until their number is a multiple of `multiple` (HF's rule)."""
    missing = -len(frames) % multiple
    return list(frames) + [frames[-1]] * missing


def qwen_video_patches(image_processor: Any, frames: list[Any], temporal_patch_size: int) -> tuple[Tensor, list[int]]:
    """One video's patches [grid_t * grid_h * grid_w, C * T * P * P] and its grid [grid_t, grid_h, grid_w].

    Patches are ordered as Qwen's video processor orders them: temporal patch, then the image
    processor's spatial order (merge units of merge_size x merge_size patches, row-major); within a
    patch, channel, then frame, then the P x P pixels.
    """
    frames = pad_frames(frames, temporal_patch_size)
    out = image_processor(images=frames, return_tensors="pt")
    pixels, grids = out["pixel_values"], out["image_grid_thw"]
    if not bool((grids == grids[0]).all()):
        raise UserInputError(f"the frames of a video must share one size; the image processor made grids "
                             f"{sorted({tuple(g) for g in grids.tolist()})}: resize the frames to one size")
    _, grid_h, grid_w = (int(v) for v in grids[0])
    image_t = int(getattr(image_processor, "temporal_patch_size", temporal_patch_size))
    channels = pixels.shape[1] // (image_t * int(image_processor.patch_size) ** 2)
    patch = int(image_processor.patch_size)
    # [frames, cells, C, T_image, P, P]: every image's T_image slots hold the same frame; keep slot 0
    per_frame = pixels.view(len(frames), grid_h * grid_w, channels, image_t, patch, patch)[:, :, :, 0]
    grid_t = len(frames) // temporal_patch_size
    groups = per_frame.view(grid_t, temporal_patch_size, grid_h * grid_w, channels, patch, patch)
    patches = groups.permute(0, 2, 3, 1, 4, 5).reshape(grid_t * grid_h * grid_w, -1)
    return patches, [grid_t, grid_h, grid_w]


def frame_records(n_frames: int, grid: tuple[int, int], trailing: int = 0) -> list[ImageTile]:
    """Records of a video whose frames are consecutive grids: "frame" k at [k * n, (k + 1) * n) (index k),
    then `trailing` non-spatial "newline" tokens (LLaVA-OneVision closes a video with one)."""
    rows, cols = grid
    size = rows * cols
    records = [ImageTile("frame", torch.arange(k * size, (k + 1) * size), (rows, cols), index=k) for k in range(n_frames)]
    if trailing:
        start = n_frames * size
        records.append(ImageTile("newline", torch.arange(start, start + trailing), (trailing, 1), spatial=False))
    return records


def qwen3_timestamps(n_frames: int, fps: float, temporal_patch_size: int) -> list[float]:
    """Qwen3-VL's time of each temporal patch: the mean of its first and last frame's time (frame i at
    i / fps; the last frame repeated to fill the final patch), as its processor computes them."""
    indices = list(range(n_frames))
    indices += [indices[-1]] * (-len(indices) % temporal_patch_size)
    times = [i / fps for i in indices]
    return [(times[i] + times[i + temporal_patch_size - 1]) / 2 for i in range(0, len(times), temporal_patch_size)]


def normalized_frames(frames: list[Any], size: tuple[int, int], mean: Any, std: Any, crop: bool) -> Tensor:
    """[T, 3, height, width] float: each frame resized (bicubic) to `size` = (height, width), or with `crop`
    resized so its shorter side fits and centre-cropped to it, as LLaVA video processors do; rescaled to
    [0, 1] and normalised by the processor's mean / std."""
    height, width = size
    out = []
    for frame in frames:
        if crop:
            scale = max(height / frame.height, width / frame.width)
            resized = frame.resize((max(width, round(frame.width * scale)), max(height, round(frame.height * scale))),
                                   Image.Resampling.BICUBIC)
            left, top = (resized.width - width) // 2, (resized.height - height) // 2
            resized = resized.crop((left, top, left + width, top + height))
        else:
            resized = frame.resize((width, height), Image.Resampling.BICUBIC)
        pixels = np.asarray(resized.convert("RGB"), dtype=np.float32) / 255.0
        out.append((pixels - np.asarray(mean, dtype=np.float32)) / np.asarray(std, dtype=np.float32))
    return torch.from_numpy(np.stack(out)).permute(0, 3, 1, 2).contiguous()

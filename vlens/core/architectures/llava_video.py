"""Videos of the LLaVA-NeXT-style families (LLaVA-OneVision, LLaVA-NeXT-Video): frames through the tower.

Every frame of a video runs through the vision tower as an image (one tower run with the batch's image
tiles, so each vision hook fires once), then the family's own video path: OneVision projects and pools
2x2 bilinearly (HF's `apply_pooling`) and closes each video with one image-newline token; LLaVA-NeXT-Video
pools the selected features (HF's `vision_resampler`) and then projects. Hooks: the projector input of the
frames at `vision.hook_video_features` [n_frames, tokens, width], each frame's final tokens at
`vision.hook_frame_embeds` [n_frames, tokens_per_frame, d_model]; the merged image and video tokens at
`vision.hook_image_embeds` in placeholder order. Videos of one batch need the same number of frames
(`pixel_values_videos` is one [n_videos, frames, C, H, W] tensor).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from vlens.core.architectures.base import ImageFeatures, ImageTile, merge_visual_features
from vlens.core.architectures.video import frame_records, normalized_frames
from vlens.core.components import HookedVisionTower
from vlens.core.config import VLMConfig
from vlens.core.hooks import HookPoint
from vlens.utils.errors import UserInputError


class LlavaVideoMixin:
    """Put before a `LlavaNextAdapter` subclass; the family gives `frame_grid`, `frame_trailing`,
    `frames_tokens` and the frames' preprocessing (`crop_frames`)."""

    crop_frames = False  # LLaVA-NeXT-Video: resize the shorter side and centre-crop; OneVision: squash

    def add_video_hooks(self, vision: HookedVisionTower) -> None:
        vision.hook_video_features = HookPoint()  # [n_frames, tokens, width]: the frames' projector input
        vision.hook_frame_embeds = HookPoint()  # [n_frames, tokens_per_frame, d_model]

    def takes_video(self) -> bool:
        return True

    def video_placeholder(self) -> str:
        return "<video>"

    def frame_size(self, processor) -> tuple[int, int]:
        tile = int(self.hf_config.vision_config.image_size)  # type: ignore[attr-defined]
        return tile, tile

    def process_videos(self, processor, videos: list[list[Any]], fps: float) -> dict[str, Any]:
        if len({len(v) for v in videos}) > 1:
            raise UserInputError(f"{self.family} takes the videos of one batch as one [videos, frames, C, H, W] "  # type: ignore[attr-defined]
                                 f"tensor: give every video the same number of frames (got {[len(v) for v in videos]})")
        image_processor = processor.image_processor
        size = self.frame_size(processor)
        return {"pixel_values_videos": torch.stack([
            normalized_frames(frames, size, image_processor.image_mean, image_processor.image_std, self.crop_frames)
            for frames in videos])}

    def process(self, processor, texts: list[str], images: list | None, **kwargs: Any):
        """The processor on prompts whose videos are already expanded (`video_prompt`): HF's processor refuses
        video tokens without videos it processes itself (torchvision), so it is told of no video token."""
        if not any(self.video_placeholder() in text for text in texts) or getattr(processor, "video_token", None) is None:
            return super().process(processor, texts, images, **kwargs)  # type: ignore[misc]
        saved = processor.video_token, getattr(processor, "video_token_id", None)
        processor.video_token, processor.video_token_id = "\x00vlens: videos already expanded\x00", None
        try:
            return super().process(processor, texts, images, **kwargs)  # type: ignore[misc]
        finally:
            processor.video_token, processor.video_token_id = saved

    def video_prompt(self, processor, video_inputs: dict[str, Any], index: int, fps: float, n_frames: int) -> str:
        """HF's own expansion (the processor's `replace_video_token`), refused where it disagrees with the tokens
        the model makes (LLaVA-NeXT-Video's processor assumes an even patch grid, its pooling floors an odd one)."""
        text = processor.replace_video_token(video_inputs, index)
        rows, cols = self.frame_grid()
        want = len(video_inputs["pixel_values_videos"][index]) * rows * cols + self.frame_trailing()
        if text.count(self.video_placeholder()) != want:
            raise UserInputError(
                f"HF's processor writes {text.count(self.video_placeholder())} video tokens for this video but the "
                f"model makes {want} ({rows}x{cols} per frame): HF's own processor and model disagree for this "
                "tower (a patch grid the pooling stride does not divide), so the model cannot run videos")
        return text

    def frame_grid(self) -> tuple[int, int]:
        """(rows, cols) of one frame's tokens."""
        raise NotImplementedError

    def frame_trailing(self) -> int:
        """Tokens after a video's frames (OneVision: one newline)."""
        return 0

    def video_token_counts(self, cfg: VLMConfig, inputs) -> tuple[list[int], list[tuple[int, int]]]:
        if inputs.pixel_values_videos is None:
            return [], []
        n_videos, n_frames = inputs.pixel_values_videos.shape[:2]
        rows, cols = self.frame_grid()
        return [n_frames * rows * cols + self.frame_trailing()] * n_videos, [(rows, cols)] * n_videos

    def video_tiles(self, cfg: VLMConfig, inputs) -> list[list[ImageTile]]:
        if inputs.pixel_values_videos is None:
            return []
        n_videos, n_frames = inputs.pixel_values_videos.shape[:2]
        return [frame_records(n_frames, self.frame_grid(), self.frame_trailing()) for _ in range(n_videos)]

    def frame_embeds(self, vision: HookedVisionTower, features: Tensor) -> Tensor:
        """[n_frames, tokens_per_frame, d_model] from the frames' selected tower features."""
        raise NotImplementedError

    def video_embeds(self, vision: HookedVisionTower, inputs, features: Tensor) -> Tensor:
        """[n_video_tokens, d_model]: every video's frame tokens (and closing tokens), videos concatenated."""
        n_videos, n_frames = inputs.pixel_values_videos.shape[:2]
        frames = vision.get_submodule("hook_frame_embeds")(self.frame_embeds(vision, features))
        return frames.reshape(n_videos, -1, frames.shape[-1]).flatten(0, 1)

    def encode_images(self, vision: HookedVisionTower, inputs) -> ImageFeatures:
        if inputs.pixel_values_videos is None:
            return super().encode_images(vision, inputs)  # type: ignore[misc]
        tiles = self.flat_pixel_values(inputs) if inputs.pixel_values is not None else None  # type: ignore[attr-defined]
        frames = inputs.pixel_values_videos.flatten(0, 1)
        pixels = torch.cat([tiles, frames.to(tiles.dtype)]) if tiles is not None else frames
        features = self.select_features(vision, inputs, pixels)  # type: ignore[attr-defined]
        n_tiles = 0 if tiles is None else len(tiles)
        images = None
        if tiles is not None:
            per_tile = self.project(vision, features[:n_tiles], "hook_image_features")  # type: ignore[attr-defined]
            images = self.pack_tiles(vision, inputs, per_tile)  # type: ignore[attr-defined]
        videos = self.video_embeds(vision, inputs, features[n_tiles:])
        ids = inputs.input_ids
        image_id, video_id = self.hf_config.image_token_id, self.hf_config.video_token_id  # type: ignore[attr-defined]
        is_video = (ids == video_id)[(ids == image_id) | (ids == video_id)]
        embeds = merge_visual_features(is_video, images, videos)
        return ImageFeatures(embeds=vision.hook_image_embeds(embeds), deepstack=[])

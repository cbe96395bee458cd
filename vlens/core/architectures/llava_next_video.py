"""LLaVA-NeXT-Video (`LlavaNextVideoForConditionalGeneration`): LLaVA-NeXT with a video path.

- Images: LLaVA-NeXT's anyres tiles, base view and newlines (`LlavaNextAdapter`), unchanged.
- Videos (`pixel_values_videos` [videos, frames, C, H, W]; `vlens.core.architectures.llava_video`): each frame
  resized on its shorter side and centre-cropped to the tower's side (as its video processor does), run
  through the tower, its selected features pooled by HF's `vision_resampler` (average / max / conv, stride
  `spatial_pool_stride`) and projected: (side / stride)^2 tokens per frame, frames in order, no newline.
- HF's `LlavaNextVideoProcessor` needs a video processor, which needs torchvision;
  `LlavaNextVideoImageTextProcessor` is HF's class without it (the same `<image>` / `<video>` expansion),
  and `load_processor` builds it from a folder when AutoProcessor cannot.
- Prompt (llava-next-video-hf's): ``USER: <video>\\n{question} ASSISTANT:``.
"""

from __future__ import annotations

import logging

from torch import Tensor
from transformers import LlavaNextVideoProcessor, ProcessorMixin

from vlens.core.architectures.base import HFModule
from vlens.core.architectures.llava_next import LlavaNextAdapter
from vlens.core.architectures.llava_video import LlavaVideoMixin
from vlens.core.architectures.registry import register_adapter
from vlens.core.components import HookedVisionTower
from vlens.core.config import VLMConfig

logger = logging.getLogger(__name__)


class LlavaNextVideoImageTextProcessor(LlavaNextVideoProcessor):
    """HF's `LlavaNextVideoProcessor` without its video processor (no torchvision): vlens expands `<video>`
    itself (`model.prepare(videos=...)`); images and text as HF's processor does."""

    @classmethod
    def get_attributes(cls) -> list[str]:
        return ["image_processor", "tokenizer"]

    def __init__(self, image_processor=None, tokenizer=None, chat_template=None, patch_size=None,
                 vision_feature_select_strategy=None, video_token="<video>", image_token="<image>",
                 num_additional_image_tokens=0, **kwargs):
        # HF's __init__ body, with the processor's attributes minus the video processor
        kwargs.pop("video_processor", None)
        self.patch_size = patch_size
        self.num_additional_image_tokens = num_additional_image_tokens
        self.vision_feature_select_strategy = vision_feature_select_strategy
        self.image_token = getattr(tokenizer, "image_token", image_token)
        self.video_token = getattr(tokenizer, "video_token", video_token)
        self.image_token_id = getattr(tokenizer, "image_token_id", None) or tokenizer.convert_tokens_to_ids(self.image_token)
        self.video_token_id = getattr(tokenizer, "video_token_id", None) or tokenizer.convert_tokens_to_ids(self.video_token)
        ProcessorMixin.__init__(self, image_processor, tokenizer, chat_template=chat_template)


@register_adapter
class LlavaNextVideoAdapter(LlavaVideoMixin, LlavaNextAdapter):
    hf_class_names = ("LlavaNextVideoForConditionalGeneration",)
    family = "llava_next_video"
    crop_frames = True  # its video processor: shorter side to the tower's side, centre crop

    def build_config(self, hf_model: HFModule) -> VLMConfig:
        cfg = super().build_config(hf_model)
        cfg.video_token_id = getattr(hf_model.config, "video_token_id", None)
        return cfg

    def build_vision(self, hf_model: HFModule) -> HookedVisionTower:
        vision = super().build_vision(hf_model)
        self.add_video_hooks(vision)
        self.hf_resampler = hf_model.model.vision_resampler  # HF's pooling of the selected frame features
        return vision

    def frame_grid(self) -> tuple[int, int]:
        side = self.geometry().side // int(self.hf_config.spatial_pool_stride)
        return side, side

    def frame_embeds(self, vision: HookedVisionTower, features: Tensor) -> Tensor:
        return self.project(vision, self.hf_resampler(features), "hook_video_features")

    def load_processor(self, name_or_path: str, trust_remote_code: bool = False):
        try:
            return LlavaNextVideoImageTextProcessor.from_pretrained(name_or_path, trust_remote_code=trust_remote_code)
        except (OSError, ValueError, TypeError) as error:
            logger.info("LlavaNextVideoImageTextProcessor unavailable for %s: %s", name_or_path, error)
            return None

    def fallback_chat_prompt(self, question: str, n_images: int) -> str:
        return "USER: " + (self.image_placeholder() + "\n") * n_images + question + " ASSISTANT:"

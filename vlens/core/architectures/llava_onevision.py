"""LLaVA-OneVision (`LlavaOnevisionForConditionalGeneration`): LLaVA-NeXT's anyres with its own rules.

- Decoder and tower: LLaVA's (Qwen2 text model in the released checkpoints; SigLIP tower, no
  CLS, strategy "full", the last layer's features).
- Anyres differs from LLaVA-NeXT in three places, all HF's (`pack_image_features`, run on the
  hooked projector output): (1) `vision_aspect_ratio="anyres_max_N"`: when the unpadded tile grid
  holds more than about N tiles' worth of tokens (ratio sqrt(h * w / (N g^2)) > 1.1) it is
  downscaled bilinearly to (h // ratio, w // ratio) before the newlines are added (in the regions a
  token then belongs to the tile that holds its centre); (2) an image in a prompt with several
  images (`batch_num_images` > 1, the processor's count when images are given per prompt) is not
  tiled: padded to a square, one tile, its tokens then one newline (`vlens prepare` passes
  images per prompt, as HF's chat template does); (3) the processor names the image count of
  each prompt, which the model reads.
- Videos (`pixel_values_videos` [videos, frames, C, H, W]; `vlens.core.architectures.llava_video`): each
  frame squashed to the tower's side, projected, pooled 2x2 bilinearly (HF's `apply_pooling`), the frames'
  tokens in order and one newline closing each video; regions: one "frame" record per frame.
- HF's `LlavaOnevisionProcessor` needs a video processor, which needs torchvision;
  `LlavaOnevisionImageTextProcessor` here is HF's processor class without that attribute (the same
  placeholder expansion), and `load_processor` builds it from a folder when AutoProcessor cannot.
- Prompt (llava-hf chat template): `<|im_start|>user <image>\\n{question}<|im_end|><|im_start|>assistant\\n`.
"""

from __future__ import annotations

import logging
import math

import torch
from torch import Tensor
from transformers import LlavaOnevisionProcessor

from vlens.core.architectures.base import HFModule
from vlens.core.architectures.llava_next import AnyresGeometry, LlavaNextAdapter
from vlens.core.architectures.llava_video import LlavaVideoMixin
from vlens.core.architectures.registry import register_adapter
from vlens.core.components import HookedVisionTower
from vlens.core.config import VLMConfig
from vlens.utils.errors import UserInputError

logger = logging.getLogger(__name__)


class LlavaOnevisionImageTextProcessor(LlavaOnevisionProcessor):
    """HF's `LlavaOnevisionProcessor` for images and text only (no video processor, so no torchvision).

    Built like HF's: ``LlavaOnevisionImageTextProcessor(image_processor, tokenizer, num_image_tokens=...,
    vision_feature_select_strategy=..., vision_aspect_ratio=..., chat_template=...)``; it expands
    `<image>` exactly as HF's processor does and saves / loads the same files (no video config).
    """

    @classmethod
    def get_attributes(cls) -> list[str]:
        return ["image_processor", "tokenizer"]

    def __init__(self, image_processor=None, tokenizer=None, num_image_tokens=None,
                 vision_feature_select_strategy=None, chat_template=None, image_token="<image>",
                 video_token="<video>", vision_aspect_ratio="anyres_max_9", **kwargs):
        # HF's signature without video_processor (from_pretrained passes only the parameters named here)
        kwargs.pop("video_processor", None)
        super().__init__(image_processor, tokenizer, None, num_image_tokens=num_image_tokens,
                         vision_feature_select_strategy=vision_feature_select_strategy, chat_template=chat_template,
                         image_token=image_token, video_token=video_token, vision_aspect_ratio=vision_aspect_ratio,
                         **kwargs)


def max_patches(vision_aspect_ratio: str) -> int:
    """N of "anyres_max_N", read as HF reads it."""
    return int(vision_aspect_ratio.strip("anyres_max_"))  # noqa: B005 (HF strips these characters, so do we)


@register_adapter
class LlavaOnevisionAdapter(LlavaVideoMixin, LlavaNextAdapter):
    hf_class_names = ("LlavaOnevisionForConditionalGeneration",)
    family = "llava_onevision"

    def build_config(self, hf_model: HFModule) -> VLMConfig:
        cfg = super().build_config(hf_model)
        cfg.video_token_id = getattr(hf_model.config, "video_token_id", None)
        return cfg

    def geometry(self) -> AnyresGeometry:
        base = super().geometry()
        return AnyresGeometry(base.tile_side, base.patch, base.pinpoints,
                              max_patches=max_patches(self.hf_config.vision_aspect_ratio))

    def build_vision(self, hf_model: HFModule) -> HookedVisionTower:
        vision = super().build_vision(hf_model)
        self.add_video_hooks(vision)
        self.hf_apply_pooling = hf_model.model.apply_pooling  # HF's 2x2 bilinear pooling of the frames
        return vision

    def frame_grid(self) -> tuple[int, int]:
        side = math.ceil(self.geometry().side / 2)
        return side, side

    def frame_trailing(self) -> int:
        return 1  # the image newline closing each video

    def frame_embeds(self, vision: HookedVisionTower, features: Tensor) -> Tensor:
        return self.hf_apply_pooling(self.project(vision, features, "hook_video_features"))

    def video_embeds(self, vision: HookedVisionTower, inputs, features: Tensor) -> Tensor:
        n_videos, n_frames = inputs.pixel_values_videos.shape[:2]
        frames = vision.get_submodule("hook_frame_embeds")(self.frame_embeds(vision, features))
        newline = vision.get_submodule("hook_image_newline")(vision.get_parameter("image_newline"))
        per_video = frames.reshape(n_videos, -1, frames.shape[-1])
        closing = newline.to(per_video.dtype)[None, None].expand(n_videos, 1, -1)
        return torch.cat([per_video, closing], dim=1).flatten(0, 1)

    def check_inputs(self, cfg: VLMConfig, inputs) -> None:
        ratio = inputs.extra.get("vision_aspect_ratio")
        if ratio is not None and ratio != self.hf_config.vision_aspect_ratio:
            raise UserInputError(f"vision_aspect_ratio={ratio!r} differs from the model config's "
                                 f"{self.hf_config.vision_aspect_ratio!r}, which HF's forward uses regardless: set "
                                 "model.hf_model.config.vision_aspect_ratio (and the processor's) instead")
        super().check_inputs(cfg, inputs)

    def tiled(self, inputs) -> list[bool]:
        """HF's rule: an image is tiled only when its prompt holds no other image (`batch_num_images`);
        without batch_num_images every image is tiled."""
        n_images = len(self.image_sizes(inputs))
        counts = inputs.extra.get("batch_num_images")
        if counts is None:
            return [True] * n_images
        per_prompt = [int(n) for n in (counts.tolist() if hasattr(counts, "tolist") else counts)]
        flags = [n == 1 for n in per_prompt for _ in range(n)]
        if len(flags) != n_images:
            raise UserInputError(f"batch_num_images {per_prompt} counts {len(flags)} images but image_sizes holds "
                                 f"{n_images}")
        return flags

    def pack(self, vision: HookedVisionTower, per_image: list[Tensor], inputs, newline: Tensor) -> list[Tensor]:
        """HF's OneVision `pack_image_features` (its anyres_max downscale, untiled multi-image images)."""
        sizes = torch.tensor(self.image_sizes(inputs))
        packed, _ = self.hf_pack_image_features(per_image, sizes, image_newline=newline,
                                                vision_aspect_ratio=self.hf_config.vision_aspect_ratio)
        return list(packed)

    # ---- processor ----
    def processor_images(self, rows: list[list]) -> list:
        """One list of images per prompt: the processor then counts images per prompt (batch_num_images)
        and leaves the images of a multi-image prompt untiled, as HF's chat template does."""
        return [list(row) for row in rows]

    def load_processor(self, name_or_path: str, trust_remote_code: bool = False):
        try:
            return LlavaOnevisionImageTextProcessor.from_pretrained(name_or_path, trust_remote_code=trust_remote_code)
        except (OSError, ValueError, TypeError) as error:
            logger.info("LlavaOnevisionImageTextProcessor unavailable for %s: %s", name_or_path, error)
            return None

    # ---- prompts ----
    def fallback_chat_prompt(self, question: str, n_images: int) -> str:
        return "<|im_start|>user " + self.image_placeholder() * n_images + "\n" + question + \
            "<|im_end|><|im_start|>assistant\n"

"""Mistral 3 (`Mistral3ForConditionalGeneration`: Mistral Small 3.1 / 3.2): Pixtral vision tower, RMSNorm + patch
merger + MLP projector, Mistral decoder.

- Decoder: Mistral (LLaVA's Llama / Mistral handling: GQA, `head_dim` from the config, sliding windows in
  masks and the KV cache while `sliding_window` is set). A Ministral 3 text model (`ministral3`: Llama 4's
  position-dependent query scaling) is refused with that reason.
- Vision: HF's Pixtral tower run block by block as HF runs it (patch conv, each image cropped to its
  `image_sizes`, all images' patches in one sequence, `ln_pre`, 2-D rotary, a block-diagonal mask so each
  image attends to itself), so an edit on `vision.blocks.{i}.hook_resid_post` [1, n_patches, width] always
  reaches the features; per-head `vision.blocks.{i}.attn.hook_z`; the selected layer(s)
  (`vision_feature_layer`) at `vision.hook_image_features` [n_patches, width * n_layers] (the projector's
  input); HF's projector (RMSNorm, `spatial_merge_size`^2 patch merger, MLP) -> `vision.hook_image_embeds`.
- Tokens of an image (HF's `PixtralProcessor`): rows of `[IMG]` placeholders on the merged grid
  (height / (patch x merge), width / (patch x merge)), each row closed by `[IMG_BREAK]`, the last by
  `[IMG_END]`; the placeholders are the image's grid (`whole_image_tiles`), the closing tokens its markers
  (kinds "break" and "end", `inputs.regions.markers`). The processor resizes the whole image (no crop).
- Processor: HF's `PixtralProcessor` needs torchvision; `PixtralImageTextProcessor` does its image+text job
  with the PIL image processor (the same placeholders, `image_sizes`), and `load_processor` builds it from
  a folder.
- Positions: 1-D, from the attention mask (LLaVA's rule).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from transformers import BatchFeature

from vlens.core.architectures.base import ArchitectureAdapter, HFModule, ImageFeatures, ImageTile
from vlens.core.architectures.llava import LlavaAdapter
from vlens.core.architectures.registry import register_adapter
from vlens.core.architectures.simple_processor import SimpleVLProcessor, processor_from_folder
from vlens.core.components import HookedVisionTower
from vlens.core.components.vision import attach_vision_head_hooks
from vlens.core.config import VLMConfig
from vlens.core.hooks import HookPoint
from vlens.utils.errors import UserInputError


class PixtralImageTextProcessor(SimpleVLProcessor):
    """HF's `PixtralProcessor` image+text job without torchvision: the PIL image processor (pixel_values padded
    to the batch's largest image, `image_sizes`), each `[IMG]` expanded to rows of `[IMG]` closed by
    `[IMG_BREAK]` and, for the last row, `[IMG_END]`, exactly as HF's processor does."""

    def __init__(self, tokenizer: Any, image_processor: Any, patch_size: int, spatial_merge_size: int,
                 chat_template: str | None = None, image_token: str = "[IMG]",
                 image_break_token: str = "[IMG_BREAK]", image_end_token: str = "[IMG_END]"):
        super().__init__(tokenizer, image_processor, chat_template=chat_template, image_token=image_token)
        self.patch_size, self.spatial_merge_size = int(patch_size), int(spatial_merge_size)
        self.image_break_token, self.image_end_token = image_break_token, image_end_token

    def __call__(self, text: str | list[str] | None = None, images: Any = None, return_tensors: str = "pt",
                 padding: bool | str = True, **tokenizer_kwargs: Any) -> BatchFeature:
        if isinstance(images, (list, tuple)) and any(isinstance(row, (list, tuple)) for row in images):
            images = [image for row in images for image in (row if isinstance(row, (list, tuple)) else [row])]
        out = super().__call__(text=text, images=images or None, return_tensors=return_tensors, padding=padding,
                               **tokenizer_kwargs)
        out.pop("mm_token_type_ids", None)  # HF's Pixtral processor returns none
        return out

    def process_images(self, images: list) -> dict:
        # HF's PixtralProcessor resizes to multiples of the merged patch (patch_size x spatial_merge_size)
        side = self.patch_size * self.spatial_merge_size
        return dict(self.image_processor(images=images, return_tensors="pt", patch_size={"height": side, "width": side}))

    def _expand_placeholders(self, texts: list[str], image_inputs: dict, n_images: int) -> list[str]:
        side = self.patch_size * self.spatial_merge_size
        layouts = []
        for height, width in image_inputs["image_sizes"].tolist():
            rows = [[self.image_token] * (int(width) // side) + [self.image_break_token]] * (int(height) // side)
            tokens = [token for row in rows for token in row]
            tokens[-1] = self.image_end_token
            layouts.append("".join(tokens))
        return self.expand_layouts(texts, layouts, n_images)

    def save_pretrained(self, folder: str) -> None:
        super().save_pretrained(folder)
        settings = {"processor_class": "PixtralProcessor", "patch_size": self.patch_size,
                    "spatial_merge_size": self.spatial_merge_size, "image_token": self.image_token,
                    "image_break_token": self.image_break_token, "image_end_token": self.image_end_token}
        Path(folder, "processor_config.json").write_text(json.dumps(settings, indent=2))

    @classmethod
    def from_pretrained(cls, folder: str, **kwargs: Any) -> PixtralImageTextProcessor:
        """From a saved folder: its tokenizer, Pixtral PIL image processor, chat template, and the patch size
        and merge of its processor config (or, failing that, of the model config)."""
        from transformers import AutoTokenizer, PixtralImageProcessorPil

        settings: dict = {}
        for name in ("processor_config.json", "config.json"):
            path = Path(folder, name)
            if path.exists():
                data = json.loads(path.read_text())
                if name == "config.json":
                    data = {"patch_size": data.get("vision_config", {}).get("patch_size"),
                            "spatial_merge_size": data.get("spatial_merge_size")}
                settings = {k: v for k, v in data.items() if v is not None} | settings
        if "patch_size" not in settings or "spatial_merge_size" not in settings:
            raise UserInputError(f"{folder}: no patch_size / spatial_merge_size in processor_config.json or config.json")
        template_path = Path(folder, "chat_template.jinja")
        tokenizer = AutoTokenizer.from_pretrained(folder, **kwargs)
        return cls(tokenizer, PixtralImageProcessorPil.from_pretrained(folder),
                   patch_size=settings["patch_size"], spatial_merge_size=settings["spatial_merge_size"],
                   chat_template=template_path.read_text() if template_path.exists() else None,
                   **{k: settings[k] for k in ("image_token", "image_break_token", "image_end_token") if k in settings})


@register_adapter
class Mistral3Adapter(LlavaAdapter):
    """LLaVA's decoder handling and 1-D positions; Pixtral's tower, merger and token layout."""

    hf_class_names = ("Mistral3ForConditionalGeneration",)
    family = "mistral3"

    def build_config(self, hf_model: HFModule) -> VLMConfig:
        config = hf_model.config
        text = config.get_text_config()
        rope = getattr(text, "rope_parameters", None) or {}
        if text.model_type != "mistral" or rope.get("llama_4_scaling_beta"):
            raise UserInputError(
                f"this Mistral 3 checkpoint's text model is {text.model_type!r}; vlens runs Mistral 3 with a Mistral "
                "text model only (Ministral 3 scales its queries by position, Llama 4's rule, which vlens's "
                "attention does not reproduce yet).")
        self.feature_layer = config.vision_feature_layer
        self.select_strategy = "full"  # Pixtral has no CLS token to drop
        self.patch_size = int(config.vision_config.patch_size)
        self.merge = int(config.spatial_merge_size)
        self.tower_has_cls = False
        return self.decoder_config(hf_model)

    # ---- vision ----
    def build_vision(self, hf_model: HFModule) -> HookedVisionTower:
        tower = hf_model.model.vision_tower  # PixtralVisionModel
        layers = list(tower.transformer.layers)
        vision = HookedVisionTower(tower, layers, projector=hf_model.model.multi_modal_projector)
        vision.hook_image_features = HookPoint()  # projector input [n_patches, width * n_layers]
        attach_vision_head_hooks(vision, [layer.attention.o_proj for layer in layers],
                                 hf_model.config.vision_config.num_attention_heads)
        return vision

    def check_inputs(self, cfg: VLMConfig, inputs) -> None:
        pixel_values = inputs.pixel_values
        if pixel_values is None:
            return
        if pixel_values.ndim != 4:
            raise UserInputError(f"Mistral 3 expects pixel_values [n_images, channels, height, width], got "
                                 f"{tuple(pixel_values.shape)}. Build inputs with model.prepare(...) or the processor.")
        sizes = inputs.extra.get("image_sizes")
        if sizes is None:  # one image size for all: the padded size (HF's default)
            inputs.extra["image_sizes"] = torch.tensor([list(pixel_values.shape[-2:])] * pixel_values.shape[0])
        elif tuple(torch.as_tensor(sizes).shape) != (pixel_values.shape[0], 2):
            raise UserInputError(f"image_sizes must be [n_images, 2] (height, width) for {pixel_values.shape[0]} "
                                 f"images, got {tuple(torch.as_tensor(sizes).shape)}")

    def _sizes(self, inputs) -> list[tuple[int, int]]:
        return [(int(h), int(w)) for h, w in torch.as_tensor(inputs.extra["image_sizes"]).tolist()]

    def encode_images(self, vision: HookedVisionTower, inputs) -> ImageFeatures:
        from transformers.models.pixtral.modeling_pixtral import generate_block_attention_mask

        tower: HFModule = vision.tower
        sizes = self._sizes(inputs)
        feature_layer = inputs.extra.get("vision_feature_layer", self.feature_layer)
        layers = [feature_layer] if isinstance(feature_layer, int) else list(feature_layer)
        # HF's PixtralVisionModel.forward, block by block (its hidden_states: the ln_pre output, then each layer's)
        embeds = tower.patch_conv(inputs.pixel_values.to(tower.patch_conv.weight.dtype))
        pieces = [embed[..., : h // self.patch_size, : w // self.patch_size] for embed, (h, w)
                  in zip(embeds, sizes, strict=True)]
        hidden = tower.ln_pre(torch.cat([p.flatten(1).T for p in pieces], dim=0).unsqueeze(0))
        positions = torch.cat([torch.stack(torch.meshgrid(torch.arange(p.shape[-2], device=p.device),
                                                          torch.arange(p.shape[-1], device=p.device), indexing="ij"),
                                           dim=-1).reshape(-1, 2) for p in pieces])
        rotary = tower.patch_positional_embedding(hidden, positions)
        mask = generate_block_attention_mask([p.shape[-2] * p.shape[-1] for p in pieces], hidden)
        states = [hidden]
        for layer in tower.transformer.layers:
            hidden = layer(hidden, mask, position_embeddings=rotary)
            states.append(hidden)
        selected = torch.cat([states[i] for i in layers], dim=-1).squeeze(0)
        features = vision.get_submodule("hook_image_features")(selected)
        if vision.projector is None:
            raise RuntimeError("a Mistral 3 vision tower needs its multi-modal projector")
        embeds = vision.projector(features, torch.tensor(sizes))
        return ImageFeatures(embeds=vision.hook_image_embeds(embeds), deepstack=[])

    def image_token_counts(self, cfg: VLMConfig, inputs) -> tuple[list[int], list[tuple[int, int]]]:
        """The merged grid of each image (its `image_sizes` / (patch x merge)); one `[IMG]` per cell."""
        if inputs.pixel_values is None:
            return [], []
        side = self.patch_size * self.merge
        grids = [(h // side, w // side) for h, w in self._sizes(inputs)]
        return [rows * cols for rows, cols in grids], grids

    def image_tiles(self, cfg: VLMConfig, inputs) -> list[list[ImageTile]] | None:
        return None  # one grid per image, row-major (the closing tokens are markers)

    def image_markers(self, cfg: VLMConfig, inputs) -> list[list[ImageTile]] | None:
        """Each row's closing token, `[IMG_BREAK]` ("break") or, after the last row, `[IMG_END]` ("end"): row r's
        sits cols tokens after the row's first placeholder, r * (cols + 1) from the image's first."""
        _, grids = self.image_token_counts(cfg, inputs)
        markers = []
        for rows, cols in grids:
            marks = [ImageTile("break" if r < rows - 1 else "end", torch.tensor([r * (cols + 1) + cols]), (1, 1),
                               spatial=False) for r in range(rows)]
            markers.append(marks)
        return markers

    def image_points_to_grid(self, processor, points: Tensor, image_size: tuple[int, int],
                             grid: tuple[int, int]) -> tuple[Tensor, Tensor]:
        # Pixtral resizes the whole image (no crop, no padding inside the image's own size)
        return ArchitectureAdapter.image_points_to_grid(self, processor, points, image_size, grid)

    # ---- prompts ----
    def load_processor(self, name_or_path: str, trust_remote_code: bool = False):
        return processor_from_folder(PixtralImageTextProcessor, name_or_path, trust_remote_code)

    def image_placeholder(self) -> str:
        return "[IMG]"

    def fallback_chat_prompt(self, question: str, n_images: int) -> str:
        return "<s>[INST]" + self.image_placeholder() * n_images + question + "[/INST]"

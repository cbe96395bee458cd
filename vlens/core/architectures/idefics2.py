"""Idefics2 (`Idefics2ForConditionalGeneration`): a SigLIP-style tower with variable-resolution position
buckets (Idefics3's), an MLP + perceiver-resampler connector, a Mistral text decoder at `model.text_model`.

- Decoder and positions: LLaVA's (`LlavaAdapter.decoder_config`), read from `model.text_model`; a
  Mistral sliding window is the core's.
- Images (HF's `Idefics2ImageProcessor`): each image resized into [shortest_edge, longest_edge] keeping its
  aspect; with `do_image_splitting`, first cut into 4 equal crops (top-left, top-right, bottom-left,
  bottom-right) followed by the whole image, each resized alike. pixel_values [batch, max_frames, C, H, W]
  holds each prompt's frames padded to the batch's largest (all-zero frames, which HF drops, as here) and
  `pixel_attention_mask` [batch, max_frames, H, W] the real pixels; only patches wholly inside a frame
  are kept (HF's `== patch_size ** 2`).
- Vision (block by block, as HF's `get_image_features`): the tower (`Idefics3Adapter.tower_features`), then
  the connector: `modality_projection` (a gated MLP, width -> d_model) and the perceiver resampler, whose
  `n_latents` learned latents cross-attend to each frame's projected patches (and to themselves) through
  `resampler_depth` layers (HF's own), then its RMSNorm: every frame becomes `n_latents` tokens.
- Placeholders: ``<fake_token_around_image>`` + ``<image>`` * n_latents + ``<fake_token_around_image>`` per frame;
  the processor drops doubled boundaries, so a split image's frames (and adjacent images) share them.
- Regions: the latents are no places on the image, so every record is non-spatial with grid (1, n_latents):
  one "image" record for an unsplit image; otherwise a "tile" per crop (`layout` (r, c) of the 2 x 2
  `layout_grid`) and the "base" view (the whole image). `markers`: "boundary" (``<fake_token_around_image>``).
  How many frames an image takes is the bound processor's `do_image_splitting` (without a processor: HF's
  image-processor default, no splitting), checked against the placeholder runs.
- Hooks: `vision.blocks.{i}.hook_resid_post` [n_frames, n_patches, width], `vision.blocks.{i}.attn.hook_z`,
  `vision.hook_image_features` [n_frames, n_patches, width] (connector input), `vision.hook_resampler_context`
  [n_frames, n_patches, d_model] (modality projection output, what the latents read),
  `vision.resampler.{j}.hook_latents` [n_frames, n_latents, d_model] (each perceiver layer's output),
  `vision.hook_tile_embeds` [n_frames, n_latents, d_model] (connector output), `vision.hook_image_embeds`.
- Prompt (fallback, idefics2-8b): `<s>User:<image>{question}<end_of_utterance>\\nAssistant:`.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers.masking_utils import create_bidirectional_mask

from vlens.core.architectures.base import HFModule, ImageFeatures, ImageTile, placeholder_runs
from vlens.core.architectures.idefics3 import Idefics3Adapter
from vlens.core.architectures.registry import register_adapter
from vlens.core.components import HookedVisionTower
from vlens.core.components.vision import attach_vision_head_hooks
from vlens.core.config import VLMConfig
from vlens.core.hooks import HookPoint
from vlens.utils.errors import UserInputError

# the crops HF's split_images makes, in order: (row, col) of a 2 x 2 layout
_CROPS = ((0, 0), (0, 1), (1, 0), (1, 1))


class ResamplerHooks(nn.Module):
    """Hook point of one perceiver layer (`vision.resampler.{j}.hook_latents`)."""

    def __init__(self):
        super().__init__()
        self.hook_latents = HookPoint()  # [n_frames, n_latents, d_model]


@register_adapter
class Idefics2Adapter(Idefics3Adapter):
    hf_class_names = ("Idefics2ForConditionalGeneration",)
    family = "idefics2"
    whole_patches_only = True

    def build_config(self, hf_model: HFModule) -> VLMConfig:
        config = hf_model.config
        self.patch_size = int(config.vision_config.patch_size)
        self.n_latents = int(config.perceiver_config.resampler_n_latents)
        self.split = False
        self.fake_id: int | None = None
        return self.decoder_config(hf_model)

    def bind_processor(self, processor) -> None:
        image_processor = getattr(processor, "image_processor", None)
        self.split = bool(getattr(image_processor, "do_image_splitting", False))
        tokenizer = getattr(processor, "tokenizer", None)
        fake = tokenizer.convert_tokens_to_ids("<fake_token_around_image>") if tokenizer is not None else None
        self.fake_id = None if fake is None or fake == getattr(tokenizer, "unk_token_id", None) else int(fake)

    @property
    def frames_per_image(self) -> int:
        return 5 if self.split else 1

    # ---- vision ----
    def build_vision(self, hf_model: HFModule) -> HookedVisionTower:
        tower = hf_model.model.vision_model
        layers = list(tower.encoder.layers)
        connector = hf_model.model.connector
        vision = HookedVisionTower(tower, layers, projector=connector)
        vision.hook_image_features = HookPoint()  # [n_frames, n_patches, width]: connector input
        vision.hook_resampler_context = HookPoint()  # [n_frames, n_patches, d_model]: what the latents read
        vision.resampler = nn.ModuleList([ResamplerHooks() for _ in connector.perceiver_resampler.layers])
        vision.hook_tile_embeds = HookPoint()  # [n_frames, n_latents, d_model]: connector output
        heads = hf_model.config.vision_config.num_attention_heads
        attach_vision_head_hooks(vision, [layer.self_attn.out_proj for layer in layers], heads)
        return vision

    def check_inputs(self, cfg: VLMConfig, inputs) -> None:
        if inputs.pixel_values is not None:  # frames of any size: the processor pads them, HF masks the padding
            self.check_frame_rows(inputs)

    def encode_images(self, vision: HookedVisionTower, inputs) -> ImageFeatures:
        hidden, patch_mask = self.tower_features(vision, inputs)
        connector: HFModule = vision.projector
        if connector is None:
            raise RuntimeError("an idefics2 vision tower needs its connector")
        features = vision.get_submodule("hook_image_features")(hidden)
        context = vision.get_submodule("hook_resampler_context")(connector.modality_projection(features))
        resampler = connector.perceiver_resampler
        n = context.shape[0]
        latents = resampler.latents.unsqueeze(0).expand(n, *resampler.latents.shape)
        # the latents attend to the frame's real patches and to every latent (HF's Idefics2PerceiverResampler)
        keys = torch.cat([patch_mask.reshape(n, -1), torch.ones(n, latents.shape[1], dtype=torch.bool,
                                                                 device=patch_mask.device)], dim=-1)
        mask = create_bidirectional_mask(config=resampler.config, inputs_embeds=latents, attention_mask=keys)
        hooks: nn.ModuleList = vision.get_submodule("resampler")  # type: ignore[assignment]
        for layer, hook in zip(resampler.layers, hooks, strict=True):
            latents = hook.get_submodule("hook_latents")(layer(latents, context, attention_mask=mask, position_ids=None))
        per_frame = vision.get_submodule("hook_tile_embeds")(resampler.norm(latents))
        embeds = vision.hook_image_embeds(per_frame.reshape(-1, per_frame.shape[-1]))
        return ImageFeatures(embeds=embeds, deepstack=[])

    # ---- frames and regions ----
    def frame_runs(self, cfg: VLMConfig, inputs) -> list[list[tuple[int, int, int]]]:
        """Every image of the batch in order, as its frames' placeholder runs (row, start, end)."""
        if inputs.pixel_values is None or cfg.image_token_id is None:
            return []
        ids = inputs.input_ids.cpu()
        runs = placeholder_runs(ids, inputs.attention_mask.cpu(), cfg.image_token_id)
        real = [int(n) for n in self.real_frames(inputs).sum(dim=1).tolist()]
        per_row = [sum(run[0] == row for run in runs) for row in range(ids.shape[0])]
        if per_row != real:
            raise UserInputError(f"the prompts hold {per_row} frames (runs of image tokens) per row but pixel_values "
                                 f"{real}: build inputs with model.prepare(...) or the processor")
        k = self.frames_per_image
        if any(n % k for n in per_row):
            raise UserInputError(f"the processor splits each image into {k} frames but the rows hold {per_row}: "
                                 "bind the processor the inputs were made with (model.processor)")
        for _, start, end in runs:
            if end - start != self.n_latents:
                raise UserInputError(f"a frame has {end - start} placeholder tokens but the perceiver makes "
                                     f"{self.n_latents}: the processor's image_seq_len must be resampler_n_latents")
        return [runs[i:i + k] for i in range(0, len(runs), k)]

    def image_layouts(self, cfg: VLMConfig, inputs) -> list[list[ImageTile]]:
        per = self.n_latents
        out = []
        for frames in self.frame_runs(cfg, inputs):
            if len(frames) == 1:
                out.append([ImageTile("image", torch.arange(per), (1, per), spatial=False)])
                continue
            records = [ImageTile("tile", torch.arange(k * per, (k + 1) * per), (1, per), index=k, layout=cell,
                                 layout_grid=(2, 2), spatial=False) for k, cell in enumerate(_CROPS)]
            records.append(ImageTile("base", torch.arange(4 * per, 5 * per), (1, per), index=4, spatial=False))
            out.append(records)
        return out

    def image_token_counts(self, cfg: VLMConfig, inputs) -> tuple[list[int], list[tuple[int, int]]]:
        """Per image: its frames x n_latents tokens; grid: (1, n_latents), one row of latents."""
        layouts = self.image_layouts(cfg, inputs)
        return [sum(len(t.positions) for t in records) for records in layouts], [records[-1].grid for records in layouts]

    def image_markers(self, cfg: VLMConfig, inputs) -> list[list[ImageTile]] | None:
        fake = self.fake_id
        if inputs.pixel_values is None or fake is None:
            return None
        ids = inputs.input_ids.cpu()
        out = []
        for frames in self.frame_runs(cfg, inputs):
            row, first = frames[0][0], frames[0][1]
            places = sorted({p for _, start, end in frames for p in (start - 1, end)
                             if 0 <= p < ids.shape[1] and int(ids[row, p]) == fake})
            out.append([ImageTile("boundary", torch.tensor([p - first]), (1, 1), spatial=False) for p in places])
        return out

    def fallback_chat_prompt(self, question: str, n_images: int) -> str:
        return "<s>User:" + self.image_placeholder() * n_images + question + "<end_of_utterance>\nAssistant:"

"""Idefics3 (`Idefics3ForConditionalGeneration`) and SmolVLM (`SmolVLMForConditionalGeneration`):
SigLIP with variable-resolution position buckets, pixel shuffle + linear connector, split images
with row/column tags and a global image; a Llama (SmolLM) text decoder at `model.text_model`.

- Decoder and positions: LLaVA's (`LlavaAdapter.decoder_config`), read from `model.text_model`.
- Images (HF's `Idefics3ImageProcessor`): an image larger than `max_image_size` is resized to a
  multiple of it (aspect NOT kept), cut into rows x cols square sub-images and followed by a global
  image (the whole image squashed to one sub-image); a smaller one is one sub-image. pixel_values
  [batch, max_frames, C, S, S] holds each prompt's sub-images, padded with all-zero frames (which
  HF drops, as here), and `pixel_attention_mask` [batch, max_frames, S, S] the real pixels.
- Vision (block by block, as HF's `get_image_features` and `Idefics3VisionTransformer`): patch
  embeddings + bucketed position ids from the patch mask, a bidirectional mask over the real
  patches, the encoder layers, the post LayerNorm; the connector's pixel shuffle (`scale_factor`:
  s x s patches -> one token) and its linear `modality_projection`.
- Placeholders: ``<fake_token_around_image><row_r_col_c>`` + ``<image>`` * L per sub-image, a newline
  after each tile row, then ``\\n<fake_token_around_image><global-img>`` + ``<image>`` * L +
  ``<fake_token_around_image>``; an unsplit image is only the global part.
- Regions: one "image" record for an unsplit image; otherwise a "tile" per sub-image (its token
  grid, `layout` = (r, c) from its ``<row_r_col_c>`` tag, `layout_grid` = (rows, cols)) and the
  "base" view (the global image). `markers`: "tile_tag" (with the tile's layout cell), "global_tag",
  "boundary" (``<fake_token_around_image>``) and "newline" (the newlines between tile rows). The tags
  are read through the model's processor's tokenizer (`bind_processor`); without one, a sub-image
  whose tag is unknown is a non-spatial "tile" and an image ends at the tag every prompt's last
  image ends with (HF's global tag).
- Hooks: `vision.blocks.{i}.hook_resid_post` [n_frames, (S/p)^2, width], `vision.blocks.{i}.attn.hook_z`,
  `vision.hook_image_features` [n_frames, L, width * s^2] (connector projection input, after the
  pixel shuffle), `vision.hook_tile_embeds` [n_frames, L, d_model] (connector output, every real
  sub-image in pixel_values order), `vision.hook_image_embeds` [n_image_tokens, d_model].
- SmolVLM: the same model (HF keeps one frame when every frame is padding); its processor needs
  `num2words` and a video processor (torchvision), so `SmolVLMImageTextProcessor` is HF's processor
  for images and text only.
- Prompt (fallback, SmolVLM-Instruct): `<|im_start|>User:<image>{question}<end_of_utterance>\\nAssistant:`.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field

import torch
from torch import Tensor
from transformers import ProcessorMixin, SmolVLMProcessor
from transformers.masking_utils import create_bidirectional_mask

from vlens.core.architectures.base import (
    ArchitectureAdapter,
    HFModule,
    ImageFeatures,
    ImageTile,
    placeholder_runs,
)
from vlens.core.architectures.llava import LlavaAdapter
from vlens.core.architectures.registry import register_adapter
from vlens.core.components import HookedVisionTower
from vlens.core.components.vision import attach_vision_head_hooks
from vlens.core.config import VLMConfig
from vlens.core.hooks import HookPoint
from vlens.utils.errors import UserInputError

logger = logging.getLogger(__name__)

_TILE_TAG = re.compile(r"<row_(\d+)_col_(\d+)>")


class SmolVLMImageTextProcessor(SmolVLMProcessor):
    """HF's `SmolVLMProcessor` for images and text only: no video processor (torchvision) and no
    `num2words` (only videos need them); the same placeholder expansion, saved and loaded alike.

    Built like HF's: ``SmolVLMImageTextProcessor(image_processor, tokenizer, image_seq_len=...,
    chat_template=...)``.
    """

    @classmethod
    def get_attributes(cls) -> list[str]:
        return ["image_processor", "tokenizer"]

    def __init__(self, image_processor=None, tokenizer=None, image_seq_len: int = 169, chat_template=None, **kwargs):
        kwargs.pop("video_processor", None)
        self.fake_image_token = getattr(tokenizer, "fake_image_token", "<fake_token_around_image>")
        self.image_token = getattr(tokenizer, "image_token", "<image>")
        self.image_token_id = tokenizer.convert_tokens_to_ids(self.image_token)
        self.end_of_utterance_token = getattr(tokenizer, "end_of_utterance_token", "<end_of_utterance>")
        self.global_image_token = getattr(tokenizer, "global_image_token", "<global-img>")
        self.image_seq_len = image_seq_len
        self.video_token = getattr(tokenizer, "video_token", "<video>")
        ProcessorMixin.__init__(self, image_processor, tokenizer, chat_template=chat_template, **kwargs)

    def __call__(self, images=None, text=None, videos=None, **kwargs):
        if videos is not None:
            raise UserInputError("vlens runs SmolVLM on images only: pass video frames as images")
        return super().__call__(images=images, text=text, **kwargs)

    def apply_chat_template(self, conversation, chat_template=None, **kwargs):
        # HF's reads the video processor's frame settings; images need none of them
        return ProcessorMixin.apply_chat_template(self, conversation, chat_template, **kwargs)


@dataclass
class _Tags:
    """The token ids that structure Idefics3's placeholders (None: unknown, no processor bound)."""

    fake: int | None = None
    global_image: int | None = None
    tiles: dict[int, tuple[int, int]] = field(default_factory=dict)  # <row_r_col_c> id -> (r - 1, c - 1)


@dataclass
class _Frame:
    row: int
    start: int
    end: int
    tag: int | None  # the token before the sub-image's placeholders


@register_adapter
class Idefics3Adapter(LlavaAdapter):
    hf_class_names = ("Idefics3ForConditionalGeneration",)
    family = "idefics3"
    pixel_values_per_row = True  # [batch, max_frames, C, H, W]
    # SmolVLM's get_image_features keeps one frame when every frame is padding; Idefics3's drops all
    keep_one_frame = False
    whole_patches_only = False

    def language_model(self, hf_model: HFModule) -> HFModule:
        return hf_model.model.text_model

    def build_config(self, hf_model: HFModule) -> VLMConfig:
        config = hf_model.config
        self.patch_size = int(config.vision_config.patch_size)
        self.scale_factor = int(config.scale_factor)
        self.tags = _Tags()
        return self.decoder_config(hf_model)

    def bind_processor(self, processor) -> None:
        tokenizer = getattr(processor, "tokenizer", processor)
        if tokenizer is None or not hasattr(tokenizer, "convert_tokens_to_ids"):
            self.tags = _Tags()
            return
        unknown = getattr(tokenizer, "unk_token_id", None)

        def token_id(text: str | None) -> int | None:
            if text is None:
                return None
            value = tokenizer.convert_tokens_to_ids(text)
            return None if value is None or value == unknown else int(value)

        tiles = {}
        for token, index in tokenizer.get_vocab().items():
            match = _TILE_TAG.fullmatch(token)
            if match:
                tiles[int(index)] = (int(match.group(1)) - 1, int(match.group(2)) - 1)
        self.tags = _Tags(fake=token_id(getattr(processor, "fake_image_token", "<fake_token_around_image>")),
                          global_image=token_id(getattr(processor, "global_image_tag", None) or
                                                getattr(processor, "global_image_token", "<global-img>")),
                          tiles=tiles)

    # ---- vision ----
    def build_vision(self, hf_model: HFModule) -> HookedVisionTower:
        tower = hf_model.model.vision_model
        layers = list(tower.encoder.layers)
        vision = HookedVisionTower(tower, layers, projector=hf_model.model.connector)
        vision.hook_image_features = HookPoint()  # [n_frames, L, width * s^2]: connector projection input
        vision.hook_tile_embeds = HookPoint()  # [n_frames, L, d_model]: connector output
        heads = hf_model.config.vision_config.num_attention_heads
        attach_vision_head_hooks(vision, [layer.self_attn.out_proj for layer in layers], heads)
        return vision

    def check_frame_rows(self, inputs) -> None:
        """pixel_values must hold one row of frames (sub-images) per prompt."""
        pixel_values = inputs.pixel_values
        if pixel_values.ndim != 5 or pixel_values.shape[0] != inputs.input_ids.shape[0]:
            raise UserInputError(f"{self.family} expects pixel_values [batch, n_sub_images, channels, height, width] "
                                 f"(one row per prompt), got {tuple(pixel_values.shape)} for a batch of "
                                 f"{inputs.input_ids.shape[0]}. Build inputs with model.prepare(...) or the processor.")

    def check_inputs(self, cfg: VLMConfig, inputs) -> None:
        pixel_values = inputs.pixel_values
        if pixel_values is None:
            return
        self.check_frame_rows(inputs)
        height, width = pixel_values.shape[-2:]
        step = self.patch_size * self.scale_factor
        if height != width or height % step:
            raise UserInputError(f"{self.family} sub-images must be square and a multiple of patch size x scale "
                                 f"factor ({step} px), got {height}x{width}: the processor's max_image_size sets them")

    def real_frames(self, inputs) -> Tensor:
        """[batch, max_frames] bool: the frames HF keeps (not entirely zero)."""
        pixel_values = inputs.pixel_values
        b, n = pixel_values.shape[:2]
        flat = pixel_values.reshape(b * n, -1)
        real = (flat == 0.0).sum(dim=-1) != flat.shape[-1]
        if self.keep_one_frame:
            real[0] |= ~torch.any(real)
        return real.view(b, n)

    def tower_features(self, vision: HookedVisionTower, inputs) -> tuple[Tensor, Tensor]:
        """(hidden [n_frames, n_patches, width], patch_mask [n_frames, rows, cols]): the tower, block by
        block, on every real frame (sub-image), as HF's `get_image_features` and vision transformer."""
        tower: HFModule = vision.tower
        pixel_values = inputs.pixel_values
        b, n, channels, height, width = pixel_values.shape
        dtype = tower.embeddings.patch_embedding.weight.dtype
        frames = pixel_values.to(dtype).reshape(b * n, channels, height, width)
        real = self.real_frames(inputs).reshape(-1).to(frames.device)
        frames = frames[real].contiguous()
        mask = inputs.extra.get("pixel_attention_mask")
        if mask is None:
            mask = torch.ones(frames.shape[0], height, width, dtype=torch.bool, device=frames.device)
        else:
            mask = mask.reshape(b * n, *mask.shape[2:])[real.to(mask.device)].contiguous()
        p = self.patch_size
        covered = mask.unfold(1, p, p).unfold(2, p, p).sum(dim=(-1, -2))
        # Idefics2 keeps the patches that lie wholly inside the image, Idefics3 those that touch it
        patch_mask = covered == p * p if self.whole_patches_only else covered > 0
        hidden = tower.embeddings(pixel_values=frames, patch_attention_mask=patch_mask)
        attention = create_bidirectional_mask(config=tower.config, inputs_embeds=hidden,
                                              attention_mask=patch_mask.reshape(frames.shape[0], -1))
        for block in tower.encoder.layers:
            hidden = block(hidden, attention)
        return tower.post_layernorm(hidden), patch_mask

    def encode_images(self, vision: HookedVisionTower, inputs) -> ImageFeatures:
        hidden, _ = self.tower_features(vision, inputs)
        connector: HFModule = vision.projector
        if connector is None:
            raise RuntimeError(f"a {self.family} vision tower needs its connector")
        shuffled = vision.get_submodule("hook_image_features")(connector.pixel_shuffle(hidden, connector.scale_factor))
        per_frame = vision.get_submodule("hook_tile_embeds")(connector.modality_projection(shuffled))
        embeds = vision.hook_image_embeds(per_frame.reshape(-1, per_frame.shape[-1]))
        return ImageFeatures(embeds=embeds, deepstack=[])

    # ---- sub-images and regions ----
    def frame_grid(self, inputs) -> tuple[int, int]:
        """(rows, cols) of one sub-image's tokens after the pixel shuffle."""
        step = self.patch_size * self.scale_factor
        return int(inputs.pixel_values.shape[-2] // step), int(inputs.pixel_values.shape[-1] // step)

    def images(self, cfg: VLMConfig, inputs) -> list[list[_Frame]]:
        """Every image of the batch in order, as its sub-images (tiles first, the global image last)."""
        ids = inputs.input_ids.cpu()
        if cfg.image_token_id is None:
            return []
        runs = placeholder_runs(ids, inputs.attention_mask.cpu(), cfg.image_token_id)
        frames = [_Frame(row, start, end, int(ids[row, start - 1]) if start > 0 else None) for row, start, end in runs]
        global_tag = self.tags.global_image
        if global_tag is None:  # no tokenizer: HF ends every image with its global image, the last one included
            last = {f.row: f.tag for f in frames}
            global_tag = next(iter(last.values()), None) if len(set(last.values())) == 1 else None
        real = self.real_frames(inputs).sum(dim=1).tolist()
        per_row = [sum(f.row == row for f in frames) for row in range(ids.shape[0])]
        if per_row != [int(n) for n in real]:
            raise UserInputError(f"the prompts hold {per_row} sub-images (runs of image tokens) per row but "
                                 f"pixel_values {real}: build inputs with model.prepare(...) or the processor")
        grid = self.frame_grid(inputs)
        images: list[list[_Frame]] = []
        current: list[_Frame] = []
        for frame in frames:
            if frame.end - frame.start != grid[0] * grid[1]:
                raise UserInputError(f"a sub-image has {frame.end - frame.start} placeholder tokens but the model makes "
                                     f"{grid[0] * grid[1]} per sub-image: the processor's image_seq_len does not fit "
                                     "this model ((image side / patch / scale_factor) ** 2)")
            if current and current[-1].row != frame.row:
                images.append(current)
                current = []
            current.append(frame)
            if global_tag is None or frame.tag == global_tag:
                images.append(current)
                current = []
        if current:
            images.append(current)
        return images

    def image_layouts(self, cfg: VLMConfig, inputs) -> list[list[ImageTile]]:
        if inputs.pixel_values is None:
            return []
        grid = self.frame_grid(inputs)
        per = grid[0] * grid[1]
        out = []
        for frames in self.images(cfg, inputs):
            if len(frames) == 1:
                out.append([ImageTile("image", torch.arange(per), grid)])
                continue
            cells = [self.tags.tiles.get(f.tag) if f.tag is not None else None for f in frames[:-1]]
            placed = [c for c in cells if c is not None]
            known = len(placed) == len(cells)
            layout_grid = (max(c[0] for c in placed) + 1, max(c[1] for c in placed) + 1) if known else None
            records = [ImageTile("tile", torch.arange(k * per, (k + 1) * per), grid, index=k,
                                 layout=cell if known else None, layout_grid=layout_grid, spatial=known)
                       for k, cell in enumerate(cells)]
            k = len(cells)
            records.append(ImageTile("base", torch.arange(k * per, (k + 1) * per), grid, index=k))
            out.append(records)
        return out

    def image_token_counts(self, cfg: VLMConfig, inputs) -> tuple[list[int], list[tuple[int, int]]]:
        """Per image: its sub-images x L tokens; grid: the global (or only) sub-image's token grid."""
        layouts = self.image_layouts(cfg, inputs)
        return [sum(len(t.positions) for t in records) for records in layouts], [records[-1].grid for records in layouts]

    def image_tiles(self, cfg: VLMConfig, inputs) -> list[list[ImageTile]] | None:
        return self.image_layouts(cfg, inputs)

    def image_markers(self, cfg: VLMConfig, inputs) -> list[list[ImageTile]] | None:
        if inputs.pixel_values is None or self.tags.fake is None:
            return None
        ids = inputs.input_ids.cpu()
        return [_image_marks(frames, ids[frames[0].row], self.tags) for frames in self.images(cfg, inputs)]

    image_points_to_grid = ArchitectureAdapter.image_points_to_grid  # every sub-image squashes what it covers

    # ---- processor and prompts ----
    def processor_images(self, rows: list[list]) -> list:
        """One list of images per prompt (the processor checks each prompt's image count)."""
        return [list(row) for row in rows]

    def image_placeholder(self) -> str:
        return "<image>"

    def fallback_chat_prompt(self, question: str, n_images: int) -> str:
        return "<|begin_of_text|>User:" + self.image_placeholder() * n_images + question + \
            "<end_of_utterance>\nAssistant:"


def _image_marks(frames: list[_Frame], row: Tensor, tags: _Tags) -> list[ImageTile]:
    """The structure tokens of one image (its sub-images `frames`, in the row `row` of input ids), positions
    counted from its first placeholder: the boundary before each tag, the tag, the newlines after each tile
    row, the boundary after the global image."""
    first = frames[0].start
    marks: list[ImageTile] = []

    def add(kind: str, position: int, layout=None, layout_grid=None) -> None:
        marks.append(ImageTile(kind, torch.tensor([position - first]), (1, 1), layout=layout,
                               layout_grid=layout_grid, spatial=False))

    cells = [tags.tiles.get(f.tag) if f.tag is not None else None for f in frames[:-1]]
    known = [c for c in cells if c is not None]
    layout_grid = (max(c[0] for c in known) + 1, max(c[1] for c in known) + 1) if known and len(known) == len(cells) \
        else None
    for k, frame in enumerate(frames):
        if frame.start >= 2 and int(row[frame.start - 2]) == tags.fake:
            add("boundary", frame.start - 2)
        if frame.tag == tags.global_image:
            add("global_tag", frame.start - 1)
        elif k < len(cells) and cells[k] is not None:
            add("tile_tag", frame.start - 1, cells[k], layout_grid)
        if k + 1 < len(frames):  # what the processor writes after a tile row: "\n" (and "\n" before the global image)
            for position in range(frame.end, frames[k + 1].start - 2):
                add("newline", position)
        elif frame.end < len(row) and int(row[frame.end]) == tags.fake:
            add("boundary", frame.end)
    return sorted(marks, key=lambda m: int(m.positions[0]))


@register_adapter
class SmolVLMAdapter(Idefics3Adapter):
    hf_class_names = ("SmolVLMForConditionalGeneration",)
    family = "smolvlm"
    keep_one_frame = True

    def load_processor(self, name_or_path: str, trust_remote_code: bool = False):
        try:
            return SmolVLMImageTextProcessor.from_pretrained(name_or_path, trust_remote_code=trust_remote_code)
        except (OSError, ValueError, TypeError, AttributeError, ImportError) as error:
            logger.info("SmolVLMImageTextProcessor unavailable for %s: %s", name_or_path, error)
            return None

    def fallback_chat_prompt(self, question: str, n_images: int) -> str:
        return "<|im_start|>User:" + self.image_placeholder() * n_images + question + \
            "<end_of_utterance>\nAssistant:"

"""What an architecture adapter provides: the only family-specific code in vlens.

An adapter turns one HF `...ForConditionalGeneration` class into the pieces `HookedVLM`
runs: a `VLMConfig`, hooked decoder blocks built around the HF parameters, a hooked vision
tower, image features, position ids and the prompt format. Adding a family is a subclass in
its own file, registered with `@vlens.register_adapter` (see CONTRIBUTING.md).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from vlens.core.components import (
    Attention,
    Embed,
    GatedDeltaNet,
    GatedMLP,
    HookedVisionTower,
    MoEMLP,
    RMSNorm,
    RMSNormPre,
    RotaryEmbedding,
    ShortConv,
    TransformerBlock,
    Unembed,
    ZeroCenteredRMSNorm,
    ZeroCenteredRMSNormPre,
)
from vlens.core.config import VLMConfig
from vlens.utils.errors import UserInputError

# An HF model or one of its submodules. Its parts are dynamic attributes (`hf_model.config`,
# `layer.self_attn.q_proj`) that torch types as `Tensor | Module`; only adapters read them.
HFModule = Any


@dataclass
class ImageFeatures:
    """Output of the vision side for a batch.

    embeds: [n_image_tokens, d_model], all images concatenated, in placeholder order.
    deepstack: per early decoder layer, [n_image_tokens, d_model] added after that layer
        (Qwen3-VL), else empty.
    """

    embeds: Tensor
    deepstack: list[Tensor]


@dataclass(frozen=True)
class ImageTile:
    """One part of an image's placeholder tokens: a whole-image grid, a base view, a tile, ...

    Families that split an image (anyres tiles, thumbnails, separator tokens) describe each
    image's tokens as a list of these records that together hold every token of the image once.
    In `inputs.regions.tiles[row][image]` the positions are the tokens' positions in the row; an
    adapter's `image_tiles` returns them counted from the image's first placeholder token.

    Attributes:
        kind: what the tokens are. vlens's families use "image" (the whole image as one grid),
            "cls" (a leading class token), "base" (an anyres family's downscaled view of the
            whole image), "tile" (one high-resolution tile) and "newline" (the row-end tokens of
            the tiled grid); InternVL and Idefics3 / SmolVLM use "tile" for each piece of a split
            image and "base" for its whole-image view (thumbnail, global image); markers of text
            tokens (`image_markers`) use "start", "end", "tile_tag", "global_tag", "boundary",
            "newline"; another family may add its own kinds.
        positions: LongTensor [n], row-major over `grid`.
        grid: (rows, cols) of these tokens (rows * cols == n; newline tokens: (n, 1)).
        index: the tile's place in the processor's pixel_values (LLaVA-NeXT: 0 the base view,
            1 + r * layout_cols + c the tile at layout cell (r, c)); 0 where it has none.
        layout: (row, col) of a tile in the image's tile layout; None for other kinds.
        box: (x0, y0, x1, y1), the original-image pixels the grid covers (cell (r, c) covers
            the r-th of rows equal bands of [y0, y1) and the c-th of cols of [x0, x1)); None where
            the family maps pixels itself (`image_points_to_grid`, kind "image") or for tokens
            that are not places on the image.
        spatial: whether the tokens are places on the image (cells of `grid`); False for CLS and
            newline tokens.
        layout_grid: (rows, cols) of the tile layout `layout` is a cell of, where the tiles split the
            whole (squashed) image into equal bands (InternVL, Idefics3): tile (r, c) then covers the
            r-th of rows bands of the height and the c-th of cols of the width, which
            `image_points_to_tile` uses when there is no `box`; None for other kinds.
        extent: (x0, y0, x1, y1) where the grid runs past the image onto the processor's padding (an
            anyres tile at the padded edge): the whole span its cells divide into equal bands, partly
            outside the image; None: the cells divide `box` (or the layout band) exactly.
    """

    kind: str
    positions: Tensor
    grid: tuple[int, int]
    index: int = 0
    layout: tuple[int, int] | None = None
    box: tuple[float, float, float, float] | None = None
    spatial: bool = True
    layout_grid: tuple[int, int] | None = None
    extent: tuple[float, float, float, float] | None = None


def whole_image_tiles(count: int, grid: tuple[int, int]) -> list[ImageTile]:
    """The records of an image whose tokens form one grid: ``[image]``, or ``[cls, image]`` when a
    leading class token comes first (LLaVA's "full" strategy); a count that fits neither is one
    non-spatial "tokens" record."""
    rows, cols = grid
    if count == rows * cols:
        return [ImageTile("image", torch.arange(count), (rows, cols))]
    if count == rows * cols + 1:
        return [ImageTile("cls", torch.arange(1), (1, 1), spatial=False),
                ImageTile("image", torch.arange(1, count), (rows, cols))]
    return [ImageTile("tokens", torch.arange(count), (1, count), spatial=False)]


def layout_box(image_size: tuple[int, int], layout: tuple[int, int],
               layout_grid: tuple[int, int]) -> tuple[float, float, float, float]:
    """(x0, y0, x1, y1) in original pixels of tile `layout` = (r, c) of a `layout_grid` = (rows, cols)
    layout that splits the whole image into equal bands (image_size: the original (width, height))."""
    width, height = float(image_size[0]), float(image_size[1])
    (r, c), (rows, cols) = layout, layout_grid
    return (c * width / cols, r * height / rows, (c + 1) * width / cols, (r + 1) * height / rows)


def points_to_box_grid(points: Tensor, image_size: tuple[int, int], box: tuple[float, float, float, float],
                       grid: tuple[int, int]) -> tuple[Tensor, Tensor]:
    """Points (x, y) in original pixels -> (row, col) on a grid that covers `box` of the image.

    The coordinates continue outside the box (a Gaussian centred in a neighbouring tile still
    reaches this tile's cells); visible: the point lies on the image (0 <= x <= W, 0 <= y <= H).
    """
    x0, y0, x1, y1 = box
    rows, cols = grid
    if x1 <= x0 or y1 <= y0 or rows <= 0 or cols <= 0:
        raise UserInputError(f"box {box} and grid {grid} must be non-empty")
    width, height = image_size
    x, y = points[:, 0], points[:, 1]
    visible = (x >= 0) & (x <= width) & (y >= 0) & (y <= height)
    return torch.stack([(y - y0) * rows / (y1 - y0) - 0.5, (x - x0) * cols / (x1 - x0) - 0.5], dim=-1), visible


def affine_cell_boxes(to_grid, image_size: tuple[int, int], grid: tuple[int, int]) -> Tensor:
    """[rows * cols, 4] pixel boxes (x0, y0, x1, y1) of a grid's cells, row-major, from an axis-aligned
    affine map ``to_grid(points [n, 2] (x, y) float64) -> (grid coordinates [n, 2] (row, col), visible)``
    with cell centres on integers: cell (r, c) spans grid coordinates [r - 0.5, r + 0.5] x [c - 0.5, c + 0.5],
    mapped back through the map's inverse (read off at two corners of the image)."""
    width, height = float(image_size[0]), float(image_size[1])
    rows, cols = grid
    corners = torch.tensor([[0.0, 0.0], [width, height]], dtype=torch.float64)
    mapped, _ = to_grid(corners)
    mapped = mapped.to(torch.float64)
    row_scale = (mapped[1, 0] - mapped[0, 0]) / height  # grid rows per pixel
    col_scale = (mapped[1, 1] - mapped[0, 1]) / width
    if not (row_scale > 0 and col_scale > 0):
        raise RuntimeError(f"the pixel -> grid map of a {rows}x{cols} grid is not increasing ({mapped.tolist()})")
    r = torch.arange(rows, dtype=torch.float64)
    c = torch.arange(cols, dtype=torch.float64)
    y0 = (r - 0.5 - mapped[0, 0]) / row_scale
    y1 = (r + 0.5 - mapped[0, 0]) / row_scale
    x0 = (c - 0.5 - mapped[0, 1]) / col_scale
    x1 = (c + 0.5 - mapped[0, 1]) / col_scale
    return torch.stack([x0.repeat(rows), y0.repeat_interleave(cols), x1.repeat(rows), y1.repeat_interleave(cols)],
                       dim=-1)


@dataclass
class DecoderParts:
    embed: Embed
    blocks: list[TransformerBlock]
    ln_final: RMSNormPre
    unembed: Unembed
    rotary: RotaryEmbedding


class ArchitectureAdapter(ABC):
    """What vlens needs to know about one HF model family; the only place that names HF modules.

    Subclasses set `hf_class_names` and `family` and implement the abstract methods; the
    others have defaults for the Llama / Qwen decoder layout (override where a family differs).
    """

    hf_class_names: tuple[str, ...] = ()
    family: str = ""
    # why a registered family cannot be converted (Perception LM), None for every family that can
    refusal: str | None = None
    # the heads axis of the HF query norm's output: -2 for [..., n_heads, d_head] (Qwen3), 1 where
    # HF normalizes after moving heads forward, [batch, n_heads, pos, d_head] (Gemma 3)
    query_norm_head_axis: int = -2
    # the keyword HF's forward reads the images' pixels from (Phi-4-multimodal: "image_pixel_values");
    # vlens holds them as `VLMInputs.pixel_values` and passes them back to HF under this name
    hf_pixel_values_key: str = "pixel_values"
    # True where pixel_values holds one entry per batch row ([batch, max_images, ...], Idefics2/3) rather
    # than one per image: rows are then selected by row (`VLMInputs.select_rows`)
    pixel_values_per_row: bool = False
    # why vlens's LoRA (separate q / k / v / o nn.Linear projections, exported to the HF names) cannot train or
    # export this family, None where it can
    lora_refusal: str | None = None

    def hf_model_class(self, class_name: str) -> type:
        """The HF class that loads a checkpoint whose config names `class_name` (default: the class
        of that name in `transformers`; a family from another package returns its own)."""
        import transformers

        return getattr(transformers, class_name)

    # ---- conversion ----
    @abstractmethod
    def build_config(self, hf_model: HFModule) -> VLMConfig:
        """A `VLMConfig` (TransformerLens field names) from the HF model's config."""

    def language_model(self, hf_model: HFModule) -> HFModule:
        """The HF text decoder (has embed_tokens, layers, norm, rotary_emb)."""
        return hf_model.model.language_model

    def decoder_layers(self, hf_model: HFModule) -> nn.ModuleList:
        """The HF decoder layers, in order."""
        return self.language_model(hf_model).layers

    def query_projection(self, hf_layer: HFModule) -> nn.Linear:
        """A decoder layer's query projection (output [..., n_heads * d_head])."""
        return hf_layer.self_attn.q_proj

    def query_norm(self, hf_layer: HFModule) -> nn.Module | None:
        """A decoder layer's per-head query norm (output [..., n_heads, d_head]), None if the family has none."""
        return getattr(hf_layer.self_attn, "q_norm", None)

    def n_heads(self, hf_model: HFModule) -> int:
        """Query heads per decoder layer."""
        return self.build_config(hf_model).n_heads

    def build_decoder(self, hf_model: HFModule, cfg: VLMConfig) -> DecoderParts:
        """Hooked modules around the HF parameters (Llama/Qwen layer layout)."""
        lm = self.language_model(hf_model)
        blocks = [self.build_block(cfg, layer, hf_layer) for layer, hf_layer in enumerate(lm.layers)]
        return DecoderParts(
            embed=Embed(lm.embed_tokens),
            blocks=blocks,
            # the final norm's weight is applied by the unembedding (an effective W_U, as after
            # TransformerLens's fold_ln), with HF's arithmetic
            # (a zero-centred final norm stays fp32 until Unembed has applied 1 + w: HF's arithmetic, also in bf16)
            ln_final=ZeroCenteredRMSNormPre(cfg.eps) if self.norm_weight_offset else RMSNormPre(cfg.eps),
            unembed=Unembed(hf_model.lm_head, lm.norm.weight, ln_final_source=lm.norm,
                            ln_final_offset=self.norm_weight_offset),
            rotary=RotaryEmbedding(lm.rotary_emb, cfg.rope_kind),
        )

    # what the family's RMSNorms multiply by: w (0.0) or, for zero-centred norms (Qwen3.5), 1 + w (1.0)
    norm_weight_offset: float = 0.0

    def build_block(self, cfg: VLMConfig, layer: int, hf_layer: HFModule) -> TransformerBlock:
        """One decoder layer: its norms (`build_norm`), token mixer (`build_attention`) and MLP (`build_mlp`)."""
        return TransformerBlock(
            layer,
            ln1=self.build_norm(cfg, hf_layer.input_layernorm),
            attn=self.build_attention(cfg, layer, hf_layer),
            ln2=self.build_norm(cfg, hf_layer.post_attention_layernorm),
            mlp=self.build_mlp(cfg, layer, hf_layer),
        )

    def build_norm(self, cfg: VLMConfig, hf_norm: HFModule) -> RMSNormPre:
        """A hooked RMSNorm around an HF norm's weight (zero-centred where `norm_weight_offset` is 1)."""
        if self.norm_weight_offset:
            return ZeroCenteredRMSNorm(hf_norm.weight, cfg.eps, source=hf_norm)
        return RMSNorm(hf_norm.weight, cfg.eps, source=hf_norm)

    def build_attention(self, cfg: VLMConfig, layer: int, hf_layer: HFModule) -> Attention | GatedDeltaNet | ShortConv:
        """The layer's token mixer: softmax attention around HF's q/k/v/o projections (and q/k norms)."""
        sa = hf_layer.self_attn
        return Attention(
            cfg, layer, self.query_projection(hf_layer), sa.k_proj, sa.v_proj, sa.o_proj,
            q_norm=self.query_norm(hf_layer), k_norm=getattr(sa, "k_norm", None),
        )

    def build_mlp(self, cfg: VLMConfig, layer: int, hf_layer: HFModule) -> GatedMLP | MoEMLP:
        """The layer's MLP: a gated MLP around HF's gate/up/down projections."""
        mlp = hf_layer.mlp
        return GatedMLP(mlp.gate_proj, mlp.up_proj, mlp.down_proj, cfg.act_fn)

    @abstractmethod
    def build_vision(self, hf_model: HFModule) -> HookedVisionTower:
        """The HF vision tower (and projector / merger) wrapped with hook points."""

    # ---- running ----
    @abstractmethod
    def encode_images(self, vision: HookedVisionTower, inputs) -> ImageFeatures:
        """Image features in placeholder order (and DeepStack features where the family has them)."""

    @abstractmethod
    def image_token_counts(self, cfg: VLMConfig, inputs) -> tuple[list[int], list[tuple[int, int]]]:
        """Per image (in order): number of placeholder tokens and merged grid (rows, cols); for a
        tiled image, the grid of the view that covers the whole image (`image_tiles`)."""

    def image_tiles(self, cfg: VLMConfig, inputs) -> list[list[ImageTile]] | None:
        """Per image (in order), its tokens as `ImageTile` records, positions counted from the
        image's first placeholder token. None (the default): every image is one grid
        (`whole_image_tiles` of its count and grid)."""
        return None

    def image_markers(self, cfg: VLMConfig, inputs) -> list[list[ImageTile]] | None:
        """Per image (in order), the text tokens that structure its placeholders (InternVL's ``<img>`` /
        ``</img>``, Idefics3's ``<row_r_col_c>`` tags, ``<global-img>``, the tokens around each sub-image
        and the newlines between tile rows) as non-spatial `ImageTile` records, positions counted from the
        image's first placeholder token (negative before it); None (the default): the family has none."""
        return None

    def pixel_entries_per_image(self, cfg: VLMConfig, inputs) -> list[int] | None:
        """Per image, how many entries of pixel_values' first axis it takes: the default 1 each where
        pixel_values holds one entry per image (LLaVA: [n_images, ...]); families that concatenate every
        image's tiles (InternVL) count them; None where pixel_values is per batch row
        (`pixel_values_per_row`, Idefics3) or per patch with `image_grid_thw` (Qwen)."""
        if inputs.pixel_values is None or inputs.image_grid_thw is not None or self.pixel_values_per_row:
            return None
        return [1] * int(inputs.pixel_values.shape[0])

    def bind_processor(self, processor) -> None:
        """Called with the model's processor whenever it is set (None: none), for families whose token
        layout names tokens that only the tokenizer knows (Idefics3's tile tags); default: nothing."""
        return None

    def mm_token_type_ids(self, cfg: VLMConfig, input_ids: Tensor) -> Tensor | None:
        """0 for text, 1 for image placeholders, 2 for video placeholders (HF's convention)."""
        types = torch.zeros_like(input_ids, dtype=torch.int)
        if cfg.image_token_id is not None:
            types[input_ids == cfg.image_token_id] = 1
        if cfg.video_token_id is not None:
            types[input_ids == cfg.video_token_id] = 2
        return types

    def attention_blocks(self, cfg: VLMConfig, inputs) -> Tensor | None:
        """[batch, pos] the bidirectional block of each token (its tokens see each other on top of the
        causal mask; -1: causal only), or None where the family attends causally everywhere (default).
        Gemma 3: each image's tokens form one block (HF's `token_type_ids` blocks)."""
        return None

    @abstractmethod
    def position_ids(self, hf_model: HFModule, inputs) -> tuple[Tensor, Tensor | None]:
        """Prefill position ids (family layout) and per-row deltas for decoding (None if unused)."""

    @abstractmethod
    def decode_position_ids(self, attention_mask: Tensor, n_new: int, deltas: Tensor | None) -> Tensor:
        """Position ids of the last `n_new` tokens during cached decoding."""

    def image_points_to_grid(
        self, processor, points: Tensor, image_size: tuple[int, int], grid: tuple[int, int]
    ) -> tuple[Tensor, Tensor]:
        """Points (x, y) in original image pixels -> (row, col) on the image-token grid.

        points: [n, 2] float64; image_size: the original (width, height); grid: (rows, cols) of
        the image's tokens (``inputs.regions.image_grid``). Returns (grid coordinates [n, 2]
        with cell centres on integers, visible [n] bool: False for points the preprocessing
        crops away). Default: the processor resizes the whole image (Qwen's smart_resize, no
        crop), so each cell covers W / cols x H / rows original pixels whatever the resize.
        """
        width, height = image_size
        rows, cols = grid
        if width <= 0 or height <= 0 or rows <= 0 or cols <= 0:
            raise UserInputError(f"image size {image_size} and grid {grid} must be positive")
        x, y = points[:, 0], points[:, 1]
        visible = (x >= 0) & (x <= width) & (y >= 0) & (y <= height)
        return torch.stack([y * rows / height - 0.5, x * cols / width - 0.5], dim=-1), visible

    def image_points_to_tile(
        self, processor, points: Tensor, image_size: tuple[int, int], tile: ImageTile
    ) -> tuple[Tensor, Tensor]:
        """Points (x, y) in original image pixels -> (row, col) on one spatial tile's grid.

        Returns (grid coordinates [n, 2], visible [n] bool). A tile with a `box` maps through it
        (`points_to_box_grid`), one with a `layout` cell of a uniform `layout_grid` through the band it
        covers (`layout_box`); one without either (kind "image") through `image_points_to_grid`.
        """
        span = tile.extent if tile.extent is not None else tile.box
        if span is not None:
            return points_to_box_grid(points, image_size, span, tile.grid)
        if tile.layout is not None and tile.layout_grid is not None:
            return points_to_box_grid(points, image_size, layout_box(image_size, tile.layout, tile.layout_grid),
                                      tile.grid)
        return self.image_points_to_grid(processor, points, image_size, tile.grid)

    def original_image_sizes(self, inputs) -> list[tuple[int, int]] | None:
        """Each image's original (width, height) where the processor's output records it (LLaVA-NeXT,
        InternVL: `image_sizes`), else None (the default): `model.prepare` records the sizes itself."""
        return None

    def image_views(self, processor, sizes: list[tuple[int, int]]) -> list[tuple[int, tuple[int, int, int, int]]] | None:
        """Where the processor turns one image into several images of the prompt (Gemma 3's pan-and-scan
        crops): per image the model sees, (the index of the original image in `sizes`, the pixel box
        (x0, y0, x1, y1) of the original it shows). None (the default): one image seen per image given."""
        return None

    def token_pixel_boxes(self, processor, image_size: tuple[int, int], tile: ImageTile) -> Tensor:
        """The pixel box of each token of one spatial tile record in the original image: [n, 4] float64
        (x0, y0, x1, y1), row-major over `tile.grid`, NOT clipped to the image (a cell partly on the
        processor's padding runs past it; `inputs.regions.from_box` clips and keeps the full area as
        the token's area).

        Default: the exact inverse of `image_points_to_tile`, which every family's preprocessing
        makes an axis-aligned affine map per tile (resize, crop, pad, tile): evaluated at two corners,
        inverted per axis (`affine_cell_boxes`). A new family whose `image_tiles` records carry their
        `box` / `layout` (or whose `image_points_to_grid` maps its resize and crop) gets exact boxes
        for free; override only for a map that is not affine per tile.
        """
        return affine_cell_boxes(lambda points: self.image_points_to_tile(processor, points, image_size, tile),
                                 image_size, tile.grid)

    # ---- prompts ----
    def processor_images(self, rows: list[list]) -> list:
        """The processor's ``images=`` argument for one list of images per prompt (default: all
        images in one flat list, in prompt order)."""
        return [image for row in rows for image in row]

    # the placeholder vlens's generic `SimpleVLProcessor` expands for this family's images (GLM-4V: <|image|>)
    simple_processor_image_token: str = "<|image_pad|>"

    def process(self, processor, texts: list[str], images: list | None, **kwargs: Any):
        """The processor's output (input_ids, attention_mask, pixel_values, ...) for formatted prompt texts
        and their images (`processor_images`' form, None: none), left padding set by the caller; default:
        the processor itself. A family whose processor cannot take some prompts (PaliGemma's refuses rows
        without an image) formats them here as the processor formats the others."""
        if images is not None:
            kwargs["images"] = images
        return processor(text=texts, return_tensors="pt", padding=True, **kwargs)

    def mark_answer_tokens(self, cfg: VLMConfig, inputs, counts: list[int]) -> None:
        """Called on a fine-tuning batch whose rows end with their answers (`counts[row]` tokens each) for
        families whose attention depends on which tokens are targets (PaliGemma: answers are causal suffix
        tokens, the prompt a bidirectional prefix); default: nothing."""
        return None

    def load_processor(self, name_or_path: str, trust_remote_code: bool = False):
        """The family's processor for a folder where HF's AutoProcessor cannot build one (its video
        processor needs torchvision); None (the default): vlens's generic `SimpleVLProcessor`."""
        return None

    @abstractmethod
    def image_placeholder(self) -> str:
        """The text that stands for one image in a prompt (before processor expansion)."""

    @abstractmethod
    def fallback_chat_prompt(self, question: str, n_images: int) -> str:
        """The family's chat format, used when the processor has no chat template."""

    def check_inputs(self, cfg: VLMConfig, inputs) -> None:
        """Raise a clear error for inputs the family cannot run (default: every input is fine)."""
        return None

    # ---- video (docs/video.md): a family that takes videos overrides all of these ----
    def takes_video(self) -> bool:
        """Whether `model.prepare(videos=...)` works for this family (default: no)."""
        return False

    def video_refusal(self) -> str:
        """Why `model.prepare(videos=...)` refuses this family's videos."""
        return (f"the {self.family} family takes no video input here; the families that do: qwen2_vl, qwen2_5_vl, "
                "qwen3_vl (and its MoE / Qwen3.5 relatives), llava_onevision, llava_next_video (docs/video.md)")

    def process_videos(self, processor, videos: list[list[Any]], fps: float) -> dict[str, Any]:
        """The model's video inputs (pixel_values_videos, video_grid_thw, ...) for videos given as lists of
        RGB PIL frames of one size each, sampled at `fps` frames per second."""
        raise UserInputError(self.video_refusal())

    def video_placeholder(self) -> str:
        """The text that stands for one video in a formatted prompt (the chat template's video slot)."""
        raise UserInputError(f"the {self.family} family takes no video input here")

    def video_prompt(self, processor, video_inputs: dict[str, Any], index: int, fps: float, n_frames: int) -> str:
        """What `video_placeholder` becomes for video `index` of `process_videos`' output: its placeholder
        tokens (and, where the family has them, timestamps and frame markers), as HF's processor expands it;
        `n_frames`: the video's number of frames as given."""
        raise UserInputError(f"the {self.family} family takes no video input here")

    def video_token_counts(self, cfg: VLMConfig, inputs) -> tuple[list[int], list[tuple[int, int]]]:
        """Per video (in order): its number of placeholder tokens and its frames' token grid (rows, cols)."""
        return [], []

    def video_tiles(self, cfg: VLMConfig, inputs) -> list[list[ImageTile]]:
        """Per video (in order), its tokens as records, positions counted from its first placeholder: one
        spatial "frame" record per frame / temporal patch (its `index` the frame's number), plus any
        non-spatial tokens (LLaVA-OneVision's closing "newline")."""
        return []

    def frames_per_video_token(self, cfg: VLMConfig) -> int:
        """How many input frames one frame record covers (Qwen: the temporal patch size; default 1)."""
        return 1


def merge_visual_features(is_video: Tensor, images: Tensor | None, videos: Tensor | None) -> Tensor:
    """[n_visual_tokens, d]: image features at the image placeholders and video features at the video ones,
    in placeholder order (what `ImageFeatures.embeds` holds when a batch has both). is_video: bool
    [n_visual_tokens], whether each of the batch's image / video placeholders (row by row, in order) is a
    video's."""
    if videos is None or images is None:
        found = images if videos is None else videos
        if found is None:
            raise RuntimeError("no image or video features to merge")
        return found
    mask = is_video.to(images.device)
    out = images.new_empty((len(mask), images.shape[-1]))
    out[~mask] = images
    out[mask] = videos.to(images.dtype)
    return out


def placeholder_runs(input_ids: Tensor, attention_mask: Tensor, token_id: int) -> list[tuple[int, int, int]]:
    """(row, start, end) of every maximal run of consecutive placeholder tokens `token_id` (padding
    excluded), row by row, left to right: the image (or sub-image) blocks of families that wrap each
    block in marker tokens (InternVL's ``<img>...</img>``, Idefics3's tagged sub-images)."""
    runs = []
    is_placeholder = (input_ids == token_id) & attention_mask.bool()
    for row in range(input_ids.shape[0]):
        positions = is_placeholder[row].nonzero().flatten().tolist()
        start = None
        for k, position in enumerate(positions):
            if start is None:
                start = position
            if k + 1 == len(positions) or positions[k + 1] != position + 1:
                runs.append((row, start, position + 1))
                start = None
    return runs


def token_id_list(value) -> list[int]:
    """Token id(s) as a list of ints: None -> [], an int, a list / tuple or a tensor of ids."""
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return [int(v) for v in value]
    if isinstance(value, torch.Tensor):
        return [int(v) for v in value.flatten().tolist()]
    return [int(value)]

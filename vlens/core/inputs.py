"""`VLMInputs`: a batch ready for the model, and `TokenRegions`: where image/text tokens sit."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field, fields, replace
from typing import Any

import torch
from jaxtyping import Int
from torch import Tensor

from vlens.core.architectures.base import ImageTile, whole_image_tiles
from vlens.core.image_regions import (
    ImageGeometry,
    TokenSelection,
    select_box,
    select_mask,
    select_points,
    token_box,
)
from vlens.utils.errors import UserInputError


@dataclass
class TokenRegions:
    """Per batch row, where things are in the token sequence.

    Attributes:
        image: per row, LongTensor of all image-token positions (all images, in order).
        images: per row, per image, LongTensor of that image's token positions (row-major
            over its merged grid).
        text: per row, LongTensor of the non-image, non-padding positions.
        final: LongTensor [batch], the last real (non-padding) position of each row.
        image_grid: per row, per image, the merged patch grid (rows, cols). For a tiled image
            (LLaVA-NeXT / OneVision anyres) the grid of its base view, the one grid that covers the
            whole image (`image_view`); its other tokens are described by `tiles`.
        tiles: per row, per image, the `ImageTile` records that divide the image's tokens (each
            token in exactly one, positions in the row): one "image" record for an untiled image
            ("cls" + "image" with a leading class token); for an anyres image the "base" view,
            every high-resolution "tile" (its grid and place in the tile layout) and the
            "newline" tokens; for a split image (InternVL, Idefics3 / SmolVLM) each "tile" (its grid, its
            cell in the tile layout) and the "base" view (InternVL's thumbnail, Idefics3's global
            image). Empty lists where the regions were built without them.
        markers: per row, per image, non-spatial `ImageTile` records of the text tokens that structure
            the image's placeholders (positions in the row; none of them is an image token): InternVL's
            "start" / "end" (``<img>`` / ``</img>``); Idefics3's "tile_tag" (``<row_r_col_c>``, with the
            tile's layout cell), "global_tag" (``<global-img>``), "boundary" (``<fake_token_around_image>``)
            and "newline" (the newlines after each tile row). Empty lists for families without them.
        geometry: per row, per image, the pixel geometry of its tokens in the original image
            (`ImageGeometry`: each token's box), which `from_box`, `from_mask`, `from_points` and
            `token_box` read; None for an image whose original size is unknown (inputs not built by
            `model.prepare`). Empty where the regions were built without it.
        videos: per row, the indices (in `images[row]`) of the entries that are videos: a video is one
            entry of `images` (its tokens, all frames, in order of appearance among the row's images),
            with one "frame" record per frame / temporal patch in `tiles` (docs/video.md). Empty lists
            for rows without video.
        frames: per row, per video (in the row's order), one LongTensor per frame (Qwen: per temporal
            patch of `temporal_patch_size` frames) of that frame's token positions, row-major over its grid.
        frame_times: per row, per video, the time in seconds at which each frame (temporal patch) starts
            (frame index * frames per patch / fps); empty where the fps is unknown.
    """

    image: list[Tensor]
    images: list[list[Tensor]]
    text: list[Tensor]
    final: Tensor
    image_grid: list[list[tuple[int, int]]]
    tiles: list[list[list[ImageTile]]] = field(default_factory=list)
    markers: list[list[list[ImageTile]]] = field(default_factory=list)
    geometry: list[list[ImageGeometry | None]] = field(default_factory=list)
    videos: list[list[int]] = field(default_factory=list)
    frames: list[list[list[Tensor]]] = field(default_factory=list)
    frame_times: list[list[list[float]]] = field(default_factory=list)

    def region(self, name: str, row: int) -> Tensor:
        """Positions of a named region ("image", "text", "final", "all") in one row."""
        if name == "image":
            return self.image[row]
        if name == "text":
            return self.text[row]
        if name == "final":
            return self.final[row : row + 1]
        if name == "all":
            return torch.cat([self.image[row], self.text[row]]).sort().values
        raise UserInputError(f"Unknown region {name!r}: use one of 'image', 'text', 'final', 'all'.")

    def still_image_counts(self) -> list[int]:
        """Per row, how many of its `images` entries are images rather than videos."""
        return [len(images) - (len(self.videos[row]) if row < len(self.videos) else 0)
                for row, images in enumerate(self.images)]

    def frame(self, row: int, video: int, frame: int) -> Tensor:
        """Positions of one frame (temporal patch) of the `video`-th video of a row, row-major over its grid."""
        videos = self.frames[row] if row < len(self.frames) else []
        if not 0 <= video < len(videos):
            raise UserInputError(f"row {row} holds {len(videos)} video(s): video {video} is out of range")
        if not 0 <= frame < len(videos[video]):
            raise UserInputError(f"video {video} of row {row} has {len(videos[video])} frames (temporal patches): "
                                 f"frame {frame} is out of range")
        return videos[video][frame]

    def frame_cell(self, row: int, video: int, frame: int, cell: tuple[int, int]) -> Tensor:
        """The position of cell (r, c) of one frame: [1] LongTensor (label ``img{i}.f{frame}[r{r},c{c}]``)."""
        positions = self.frame(row, video, frame)
        rows, cols = self.image_grid[row][self.videos[row][video]]
        r, c = cell
        if not (0 <= r < rows and 0 <= c < cols):
            raise UserInputError(f"cell {cell} is outside the frame's {rows}x{cols} token grid")
        return positions[r * cols + c : r * cols + c + 1]

    def image_view(self, row: int, image: int = 0) -> ImageTile:
        """The record whose grid covers the whole image (kind "image", or an anyres image's "base"
        view): its positions are row-major over its grid, what per-cell figures and maps read. Where the
        whole image's tokens are no places on it (Idefics2's perceiver latents), its non-spatial record."""
        records = self.tiles[row][image] if row < len(self.tiles) and image < len(self.tiles[row]) else []
        for record in records:
            if record.spatial and record.kind in ("image", "base"):
                return record
        for record in records:  # tokens that are no places on the image (Idefics2's perceiver latents): one row
            if record.kind in ("image", "base"):
                return record
        if records and all(r.kind == "frame" for r in records):
            raise UserInputError(f"entry {image} of row {row} is a video: it has no one grid that covers it; select a "
                                 "frame (inputs.regions.frames / frame(row, video, frame)) instead")
        if not records:  # regions built by hand without tile records
            positions = self.images[row][image]
            record = whole_image_tiles(len(positions), self.image_grid[row][image])[-1]
            return replace(record, positions=positions[record.positions])
        raise RuntimeError(f"image {image} of row {row} has no grid that covers the whole image "
                         f"(its tokens: {[r.kind for r in records]})")

    def tile_positions(self, row: int, kind: str) -> Tensor:
        """Sorted positions of one row's image tokens of one kind ("image", "base", "tile", "newline", ...)."""
        found = [r.positions for records in (self.tiles[row] if row < len(self.tiles) else [])
                 for r in records if r.kind == kind]
        return torch.cat(found).sort().values if found else torch.zeros(0, dtype=torch.long)

    def marker_positions(self, row: int, kind: str) -> Tensor:
        """Sorted positions of one row's structure tokens of one kind (`markers`: "tile_tag", "start", ...)."""
        found = [r.positions for records in (self.markers[row] if row < len(self.markers) else [])
                 for r in records if r.kind == kind]
        return torch.cat(found).sort().values if found else torch.zeros(0, dtype=torch.long)

    def select(self, rows: list[int]) -> TokenRegions:
        """The regions of some rows, in the given order."""
        return TokenRegions(
            image=[self.image[r] for r in rows], images=[self.images[r] for r in rows],
            text=[self.text[r] for r in rows], final=self.final[torch.tensor(rows, dtype=torch.long)],
            image_grid=[self.image_grid[r] for r in rows],
            tiles=[self.tiles[r] for r in rows] if self.tiles else [],
            markers=[self.markers[r] for r in rows] if self.markers else [],
            geometry=[self.geometry[r] for r in rows] if self.geometry else [],
            videos=[self.videos[r] for r in rows] if self.videos else [],
            frames=[self.frames[r] for r in rows] if self.frames else [],
            frame_times=[self.frame_times[r] for r in rows] if self.frame_times else [],
        )

    # ---- image regions from geometry (vlens.core.image_regions; docs/regions.md) ----
    def image_geometry(self, image_index: int) -> ImageGeometry:
        """The pixel geometry of image `image_index` (images counted over the batch, row by row, in
        order of appearance)."""
        n_images = sum(len(row) for row in self.images)
        if isinstance(image_index, bool) or not isinstance(image_index, int) or not 0 <= image_index < n_images:
            raise UserInputError(f"image index {image_index!r} is out of range: the batch holds {n_images} image(s), "
                                 f"counted over the rows in order (0 .. {n_images - 1})")
        seen = 0
        for row, images in enumerate(self.images):
            if image_index < seen + len(images):
                found = self.geometry[row][image_index - seen] if row < len(self.geometry) else None
                if found is None:
                    raise UserInputError(
                        f"image {image_index} has no pixel geometry: its original size is unknown. Build the inputs "
                        "with model.prepare(images=..., prompts=...) (which records each image's size)")
                if len(found.positions) == 0 and len(images[image_index - seen]):
                    raise UserInputError(
                        f"image {image_index} has no token that is a place on the image (e.g. Idefics2's perceiver "
                        "latents), so a box, mask or point selects none: select its tokens by position instead "
                        "(inputs.regions.images)")
                return found
            seen += len(images)
        raise RuntimeError("unreachable: image index checked against the count")

    def from_box(self, image_index: int, box, *, threshold: float = 0.0) -> TokenSelection:
        """The tokens of image `image_index` (every view: base view, tiles, thumbnail) that the pixel box
        (x0, y0, x1, y1) of the original image covers more than `threshold` of, with each token's covered
        fraction (`TokenSelection.coverage`). threshold 0: any overlap."""
        return select_box(self.image_geometry(image_index), box, threshold)

    def from_mask(self, image_index: int, mask, *, threshold: float = 0.0) -> TokenSelection:
        """The tokens a bool [height, width] mask of the original image covers more than `threshold` of."""
        return select_mask(self.image_geometry(image_index), mask, threshold)

    def from_points(self, image_index: int, points) -> TokenSelection:
        """The tokens (one per view) whose pixels hold any of the points [[x, y], ...] (original pixels)."""
        return select_points(self.image_geometry(image_index), points)

    def token_box(self, image_index: int, pos: int, *, clip: bool = True) -> tuple[float, float, float, float]:
        """The pixel box (x0, y0, x1, y1) in the original image of the token at position `pos` of image
        `image_index` (clipped to the image; clip=False: the token's whole cell, padding included)."""
        return token_box(self.image_geometry(image_index), pos, clip)

    def mask(self, name: str, seq_len: int) -> Tensor:
        """Boolean [batch, seq_len] mask of a named region."""
        out = torch.zeros(len(self.image), seq_len, dtype=torch.bool)
        for row in range(len(self.image)):
            out[row, self.region(name, row).cpu()] = True
        return out


# processor outputs that are vlens's bookkeeping, never passed to HF's forward: each image's original (height, width)
# where the family's HF forward takes no `image_sizes` (Llama 4's processor, for the tile boxes)
VLENS_ONLY_EXTRAS = frozenset({"original_image_sizes"})
# processor outputs that count each prompt's images (LLaVA-OneVision's, prompts without images left out): a
# selection of rows counts them again
PER_PROMPT_IMAGE_COUNTS = frozenset({"batch_num_images"})


def _starts(counts) -> list[int]:
    """Where each run of `counts` consecutive entries starts, and the total last: [0, c0, c0 + c1, ...]
    (a row's first image, an image's first tile or patch)."""
    return [0, *itertools.accumulate(int(count) for count in counts)]


@dataclass
class VLMInputs:
    """Model inputs in the HF keyword form plus token regions.

    Shapes: input_ids/attention_mask/mm_token_type_ids [batch, pos]; pixel_values is the
    family's layout (Qwen: [n_patches, C*T*P*P], LLaVA: [n_images, C, H, W]);
    image_grid_thw [n_images, 3] (Qwen only). Videos (docs/video.md): pixel_values_videos (Qwen:
    [n_video_patches, C*T*P*P]; LLaVA families: [n_videos, n_frames, C, H, W]), video_grid_thw
    [n_videos, 3] and second_per_grid_ts [n_videos] (Qwen2.5-VL: seconds per temporal patch).
    """

    input_ids: Int[Tensor, "batch pos"]
    attention_mask: Int[Tensor, "batch pos"]
    pixel_values: Tensor | None = None
    image_grid_thw: Tensor | None = None
    mm_token_type_ids: Tensor | None = None
    regions: TokenRegions | None = None
    extra: dict = field(default_factory=dict)  # other processor outputs passed to the model
    # per image, its entries of pixel_values' first axis where pixel_values concatenates every image's
    # tiles (InternVL); None where there is one entry per image or per row (not passed to HF)
    pixel_entries: list[int] | None = None
    pixel_values_videos: Tensor | None = None
    video_grid_thw: Tensor | None = None
    second_per_grid_ts: Tensor | None = None
    # per video, its frames per second (`model.prepare(..., fps=)`): the frames' times in the regions
    video_fps: list[float] | None = None
    # the keyword HF's forward takes pixel_values under (Phi-4-multimodal: image_pixel_values)
    hf_pixel_key: str = "pixel_values"
    # True where pixel_values holds one entry per batch row (Idefics3: [batch, max_images, ...]; the adapter's
    # `pixel_values_per_row`), False where it is per image, per tile or per patch
    pixel_values_per_row: bool = False

    HF_KEYS = ("input_ids", "attention_mask", "pixel_values", "image_grid_thw", "mm_token_type_ids",
               "pixel_values_videos", "video_grid_thw", "second_per_grid_ts")

    @property
    def token_regions(self) -> TokenRegions:
        """`regions`, or a clear error for inputs that have none (built by hand rather than by
        `model.prepare`, or for a model whose config names no image token)."""
        if self.regions is None:
            raise UserInputError("These inputs carry no token regions (final position, image and text tokens): "
                             "build them with model.prepare(...) or model.coerce_inputs(...).")
        return self.regions

    @property
    def batch_size(self) -> int:
        return self.input_ids.shape[0]

    @property
    def seq_len(self) -> int:
        return self.input_ids.shape[1]

    @property
    def shape(self) -> torch.Size:
        """``input_ids.shape`` ([batch, pos]): what TransformerLens's patching reads from its tokens."""
        return self.input_ids.shape

    @property
    def device(self) -> torch.device:
        return self.input_ids.device

    def to(self, device) -> VLMInputs:
        moved: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            moved[f.name] = value.to(device) if isinstance(value, Tensor) else value
        moved["extra"] = {k: v.to(device) if isinstance(v, Tensor) else v for k, v in self.extra.items()}
        return VLMInputs(**moved)

    def select_rows(self, rows: list[int]) -> VLMInputs:
        """Some rows of the batch, in the given order, with their images' pixel values, by the family's layout:
        one entry per image or tiles per image (`pixel_entries`: LLaVA, InternVL), patches per image
        (`image_grid_thw`: Qwen) or one entry per row (`pixel_values_per_row`: Idefics3). Extras follow what
        they describe: rows ([batch, pos, ...] first), images, tiles or image tokens."""
        regions = self.token_regions
        index = torch.tensor(rows, dtype=torch.long)
        pixel_values, grid_thw = self.pixel_values, self.image_grid_thw
        entries, per_image = None, None  # the chosen rows' images (where pixel_values is not per row)
        if pixel_values is not None:
            images_per_row = regions.still_image_counts()
            first_image = _starts(images_per_row)
            chosen = [first_image[r] + k for r in rows for k in range(images_per_row[r])]
            if self.pixel_entries is not None:  # each image's entries (one, or its tiles) in image order
                if len(self.pixel_entries) != sum(images_per_row):
                    raise UserInputError(f"pixel_entries names {len(self.pixel_entries)} images but the prompts hold "
                                         f"{sum(images_per_row)}: build the inputs with model.prepare(...) or "
                                         "model.coerce_inputs(...) rather than editing them.")
                starts = _starts(self.pixel_entries)
                per_image = chosen
                entries = [self.pixel_entries[i] for i in per_image]
                pixel_values = torch.cat([pixel_values[starts[i]:starts[i + 1]] for i in per_image]) if per_image else None
            elif grid_thw is not None:  # patches of every image concatenated (Qwen layout)
                starts = _starts(grid_thw.prod(dim=-1).tolist())
                pixel_values = torch.cat([pixel_values[starts[i]:starts[i + 1]] for i in chosen]) if chosen else None
                grid_thw = grid_thw[torch.tensor(chosen, dtype=torch.long, device=grid_thw.device)] if chosen else None
            elif self.pixel_values_per_row:  # one entry per row (Idefics3 layout)
                pixel_values = pixel_values[index.to(pixel_values.device)]
            else:  # no layout recorded: the first axis may be images or rows, which select differently
                raise UserInputError("these inputs do not say how pixel_values is laid out (per image, per row or "
                                     "per patch), so their rows cannot be selected: build them with "
                                     "model.prepare(...) or model.coerce_inputs(...).")
        sub = self._select_extras(rows, per_image, entries)
        new_regions = regions.select(rows)
        videos = self._select_videos(regions, rows)
        dev = self.input_ids.device
        return VLMInputs(
            input_ids=self.input_ids[index.to(dev)],
            attention_mask=self.attention_mask[index.to(dev)],
            pixel_values=pixel_values,
            image_grid_thw=grid_thw,
            mm_token_type_ids=None if self.mm_token_type_ids is None else self.mm_token_type_ids[index.to(dev)],
            regions=new_regions,
            extra=sub,
            pixel_entries=entries,
            hf_pixel_key=self.hf_pixel_key,
            pixel_values_per_row=self.pixel_values_per_row,
            **videos,
        )

    def _select_extras(self, rows: list[int], per_image: list[int] | None, entries: list[int] | None) -> dict:
        """The chosen rows' tensor extras. Where pixel_values is per image (`pixel_entries`): [batch, pos, ...]
        follows the rows, then a first axis of n_images the images (LLaVA-NeXT's image_sizes), of n_tiles the
        tiles (LFM2-VL's spatial_shapes), of n_image_tokens the tokens (Molmo 2's image_token_pooling), of batch
        the rows; per-prompt image counts (`batch_num_images`) are counted again; any other tensor is refused."""
        batch, regions = self.batch_size, self.token_regions
        index = torch.tensor(rows, dtype=torch.long)
        if self.pixel_entries is None or per_image is None:  # per-row or per-patch pixels: per-row extras
            return {k: v[index.to(v.device)] for k, v in self.extra.items()
                    if isinstance(v, Tensor) and v.shape[:1] == self.input_ids.shape[:1]}
        starts = _starts(self.pixel_entries)
        n_images, n_tiles = len(self.pixel_entries), starts[-1]
        counts = [len(p) for row_images in regions.images for p in row_images]
        firsts = _starts(counts)
        picks = {  # where two counts agree the images' pick wins (written last), then the tiles'
            sum(counts): [t for i in per_image for t in range(firsts[i], firsts[i] + counts[i])],
            n_tiles: [t for i in per_image for t in range(starts[i], starts[i + 1])],
            n_images: per_image,
        }
        per_row_images = regions.still_image_counts()
        out: dict[str, Any] = {}
        for key, value in self.extra.items():
            if not isinstance(value, Tensor) or not value.ndim:
                continue
            if key in PER_PROMPT_IMAGE_COUNTS:  # the chosen prompts' image counts (prompts without images left out)
                if per_image:
                    out[key] = torch.tensor([per_row_images[r] for r in rows if per_row_images[r]],
                                            dtype=value.dtype, device=value.device)
                continue
            if value.shape[:2] == self.input_ids.shape[:2]:
                pick = rows
            elif value.shape[0] in picks:
                pick = picks[value.shape[0]]
            elif value.shape[0] == batch:
                pick = rows
            else:
                raise UserInputError(f"the extra input {key!r} {tuple(value.shape)} has a first axis of neither the "
                                     f"batch ({batch}), the images ({n_images}), their tiles ({n_tiles}) nor their "
                                     f"image tokens ({sum(counts)}): its rows cannot be selected. Build the inputs "
                                     "with model.prepare(...).")
            if pick:
                out[key] = value[torch.tensor(pick, dtype=torch.long, device=value.device)]
        return out

    def _select_videos(self, regions: TokenRegions, rows: list[int]) -> dict[str, Any]:
        """The video tensors of the chosen rows' videos (Qwen: patches per grid; LLaVA: one entry per video)."""
        if self.pixel_values_videos is None:
            return {}
        per_row = [len(v) for v in regions.videos] if regions.videos else [0] * self.batch_size
        first = _starts(per_row)
        chosen = [first[r] + k for r in rows for k in range(per_row[r])]
        out: dict[str, Any] = {"video_fps": None if self.video_fps is None else [self.video_fps[i] for i in chosen]}
        if not chosen:
            return out
        pick = torch.tensor(chosen, dtype=torch.long)
        pixels, grid = self.pixel_values_videos, self.video_grid_thw
        if grid is None:  # one [frames, C, H, W] entry per video
            out["pixel_values_videos"] = pixels[pick.to(pixels.device)]
        else:
            starts = _starts(grid.prod(dim=-1).tolist())
            out["pixel_values_videos"] = torch.cat([pixels[starts[i]:starts[i + 1]] for i in chosen])
            out["video_grid_thw"] = grid[pick.to(grid.device)]
        if self.second_per_grid_ts is not None:
            out["second_per_grid_ts"] = self.second_per_grid_ts[pick.to(self.second_per_grid_ts.device)]
        return out

    @property
    def ndim(self) -> int:
        """2, as ``input_ids`` ([batch, pos]): TransformerLens's analysis tools check their token tensors' ndim."""
        return 2

    def __getitem__(self, rows: slice) -> VLMInputs:
        """Rows of the batch (``inputs[i : i + 1]``, as TransformerLens's tools slice token tensors; `select_rows`)."""
        if not isinstance(rows, slice):
            raise UserInputError(f"VLMInputs are indexed by a slice of rows (inputs[i:i + 1]), not {rows!r}: use "
                                 "inputs.select_rows([...]) for a list of rows.")
        return self.select_rows(list(range(self.batch_size))[rows])

    def to_hf_kwargs(self) -> dict:
        """The keyword arguments an HF `...ForConditionalGeneration` forward takes."""
        out = {k: getattr(self, k) for k in self.HF_KEYS if getattr(self, k) is not None}
        if "pixel_values" in out and self.hf_pixel_key != "pixel_values":
            out[self.hf_pixel_key] = out.pop("pixel_values")
        out.update({k: v for k, v in self.extra.items() if k not in VLENS_ONLY_EXTRAS})
        return out


def check_input_tensors(inputs: VLMInputs, d_vocab: int, n_ctx: int) -> None:
    """One clear `UserInputError` for inputs the model cannot run as given (hand-edited `VLMInputs`, a
    processor output from elsewhere), before any tensor reaches a layer: input_ids an integer
    [batch, pos] tensor of ids below `d_vocab`, no longer than the model's context `n_ctx` (positions
    beyond it are untrained, and the attention grids grow as pos^2); attention_mask of the same shape
    holding 0 / 1; pixel_values floating point. (Placeholder counts against the images are checked
    where the image features are made.)"""
    fix = "build inputs with model.prepare(...) or the model's processor"
    ids, mask = inputs.input_ids, inputs.attention_mask
    if not isinstance(ids, Tensor) or ids.ndim != 2:
        shape = tuple(ids.shape) if isinstance(ids, Tensor) else type(ids).__name__
        raise UserInputError(f"input_ids must be a [batch, pos] tensor, got {shape}: {fix}")
    if ids.dtype == torch.bool or ids.is_floating_point() or ids.is_complex():
        raise UserInputError(f"input_ids must hold integer token ids, got dtype {ids.dtype}: {fix}")
    if ids.shape[1] > n_ctx:
        raise UserInputError(f"the prompt is {ids.shape[1]} tokens long, longer than the model's context of {n_ctx} "
                             "positions (max_position_embeddings): shorten the prompt or use fewer / smaller images")
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= d_vocab):
        raise UserInputError(f"input_ids hold token ids outside the vocabulary [0, {d_vocab}) (from "
                             f"{int(ids.min())} to {int(ids.max())}): {fix}")
    if not isinstance(mask, Tensor) or tuple(mask.shape) != tuple(ids.shape):
        shape = tuple(mask.shape) if isinstance(mask, Tensor) else type(mask).__name__
        raise UserInputError(f"attention_mask must have input_ids' shape {tuple(ids.shape)}, got {shape}: {fix}")
    if mask.numel() and not bool(((mask == 0) | (mask == 1)).all()):
        raise UserInputError(f"attention_mask must hold only 0 (padding) and 1, got values {mask.unique().tolist()[:6]}")
    pixels = inputs.pixel_values
    if pixels is not None and (not isinstance(pixels, Tensor) or not pixels.is_floating_point()):
        what = pixels.dtype if isinstance(pixels, Tensor) else type(pixels).__name__
        raise UserInputError(f"pixel_values must be a floating-point tensor (the processor's normalised pixels), got "
                             f"{what}: {fix}")


@dataclass
class VideoLayout:
    """What `compute_regions` needs of a batch's videos (in order of appearance): each video's token
    count, its frames' grid (rows, cols), its "frame" records (positions from the video's first token),
    and each frame's start time in seconds (empty where unknown)."""

    token_id: int
    counts: list[int]
    grids: list[tuple[int, int]]
    tiles: list[list[ImageTile]]
    times: list[list[float]]


def compute_regions(
    input_ids: Tensor,
    attention_mask: Tensor,
    image_token_id: int,
    image_token_counts: list[int],
    image_grids: list[tuple[int, int]],
    image_tiles: list[list[ImageTile]] | None = None,
    image_markers: list[list[ImageTile]] | None = None,
    videos: VideoLayout | None = None,
) -> TokenRegions:
    """Token regions from the ids and each image's token count / merged grid (in order of appearance).

    image_tiles: per image, its `ImageTile` records with positions counted from the image's first
        token (an adapter's `image_tiles`); None: each image is one grid (`whole_image_tiles`).
    image_markers: per image, records of its structure tokens, positions counted from the image's
        first placeholder token (an adapter's `image_markers`); None: no markers.
    videos: the batch's videos (their placeholder id, counts, frame records): each video becomes one
        entry of `images` in order of appearance among the row's images, listed in `videos` / `frames`.
        A video's tokens need not be contiguous (Qwen3-VL puts a timestamp before each temporal patch).

    Raises:
        UserInputError: if the placeholder tokens do not add up to the images' (videos') token counts.
    """
    batch = input_ids.shape[0]
    valid = attention_mask.bool()
    is_image = (input_ids == image_token_id) & valid
    is_video = (input_ids == videos.token_id) & valid if videos is not None else torch.zeros_like(is_image)
    for what, mask, counts in (("image", is_image, image_token_counts),
                               ("video", is_video, videos.counts if videos is not None else [])):
        if int(mask.sum()) != sum(counts):
            raise UserInputError(
                f"The prompts hold {int(mask.sum())} {what} placeholder tokens but the {what}s need "
                f"{sum(counts)} ({counts} per {what}). Build inputs with model.prepare(...) or the model's "
                "processor so placeholders are expanded to match."
            )
    if image_tiles is None:
        image_tiles = [whole_image_tiles(c, g) for c, g in zip(image_token_counts, image_grids, strict=True)]
    markers_given = image_markers is not None
    marker_lists = image_markers if image_markers is not None else [[] for _ in image_token_counts]
    image_iter = iter(zip(image_token_counts, image_grids, image_tiles, marker_lists, strict=True))
    video_iter = iter(zip(videos.counts, videos.grids, videos.tiles,
                          videos.times or [[] for _ in videos.counts], strict=True)) if videos is not None else iter(())
    images, image_all, text, grids, tiles, markers = [], [], [], [], [], []
    video_index: list[list[int]] = []
    frames: list[list[list[Tensor]]] = []
    frame_times: list[list[list[float]]] = []
    for row in range(batch):
        kinds = {"image": is_image[row].nonzero().flatten(), "video": is_video[row].nonzero().flatten()}
        taken = {"image": 0, "video": 0}
        row_images: list[Tensor] = []
        row_grids: list[tuple[int, int]] = []
        row_tiles: list[list[ImageTile]] = []
        row_markers: list[list[ImageTile]] = []
        row_videos: list[int] = []
        row_frames: list[list[Tensor]] = []
        row_times: list[list[float]] = []
        while any(taken[k] < len(kinds[k]) for k in kinds):
            # the next visual input is whichever kind's next placeholder comes first
            kind = min((k for k in kinds if taken[k] < len(kinds[k])), key=lambda k: int(kinds[k][taken[k]]))
            if kind == "image":
                count, grid, records, marks = next(image_iter)
            else:
                count, grid, records, times = next(video_iter)
                marks = []
            here = kinds[kind][taken[kind] : taken[kind] + count]
            if sum(len(r.positions) for r in records) != count:
                raise RuntimeError(f"the tile records of an {kind} hold {sum(len(r.positions) for r in records)} "
                                 f"tokens but the {kind} has {count}")
            placed = [replace(r, positions=here[r.positions.long()]) for r in records]
            if kind == "video":
                row_videos.append(len(row_images))
                row_frames.append([r.positions for r in placed if r.kind == "frame"])
                row_times.append(list(times))
            row_images.append(here)
            row_grids.append(grid)
            row_tiles.append(placed)
            row_markers.append([replace(m, positions=here[0] + m.positions.long()) for m in marks])
            taken[kind] += count
        images.append(row_images)
        grids.append(row_grids)
        tiles.append(row_tiles)
        markers.append(row_markers)
        video_index.append(row_videos)
        frames.append(row_frames)
        frame_times.append(row_times)
        visual = (is_image[row] | is_video[row])
        image_all.append(visual.nonzero().flatten())
        text.append((valid[row] & ~visual).nonzero().flatten())
    final = torch.tensor(
        [int(valid[row].nonzero().max()) if valid[row].any() else input_ids.shape[1] - 1 for row in range(batch)],
        dtype=torch.long,
    )
    return TokenRegions(image=image_all, images=images, text=text, final=final, image_grid=grids, tiles=tiles,
                        markers=markers if markers_given else [], videos=video_index, frames=frames,
                        frame_times=frame_times)

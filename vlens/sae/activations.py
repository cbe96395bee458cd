"""Streaming a hook's activations from a model over a dataset, at chosen token regions.

An `ActivationSource` cuts its examples into chunks of ``prompts_per_chunk`` prompts; chunk i is
one forward (stopped after the hook's layer) and yields the activations at the chosen positions
plus where each came from (`TokenSites`: example, position, image-grid cell). Chunks are
addressed by index, so a trainer resumes at any chunk without recomputing earlier ones, and
`cache_dir` keeps them on disk (one safetensors file per chunk, reused while the manifest matches).
`TensorSource` serves a tensor the same way (tests, activations computed elsewhere).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch
from jaxtyping import Float, Int
from PIL import Image
from safetensors.torch import load_file, save_file
from torch import Tensor

from vlens.core.model import HookedVLM
from vlens.datasets import Record, open_images
from vlens.utils.errors import UserInputError
from vlens.utils.fileio import read_json_file
from vlens.utils.provenance import weights_digest
from vlens.utils.validation import check_choice, check_count

REGIONS = ("image", "text", "final", "all")


@dataclass(frozen=True)
class ActivationOptions:
    """Which activations to stream.

    Attributes:
        hook_name: any hook of the model with a [batch, pos, ...] activation (hook_z: heads flattened).
        positions: "image", "text", "final" (last prompt position) or "all" (image and text).
        cells: with positions="image", only these (row, col) cells of each image's token grid (of every
            frame of a video).
        prompts_per_chunk: prompts per forward (one chunk).
        chat: wrap questions in the model's chat template (as `model.prepare` does by default).
    """

    hook_name: str
    positions: str = "image"
    cells: tuple[tuple[int, int], ...] | None = None
    prompts_per_chunk: int = 8
    chat: bool = True

    def __post_init__(self) -> None:
        check_choice(self.positions, "positions", REGIONS)
        check_count(self.prompts_per_chunk, "prompts_per_chunk")
        if self.cells is not None and self.positions != "image":
            raise UserInputError("cells select image-grid cells: use them with positions='image'.")


@dataclass
class TokenSites:
    """Where each row of a chunk's activations comes from: example index, token position, image-grid
    cell (row, col; -1 for text tokens) and whether it is an image token."""

    example: Int[Tensor, " n"]
    position: Int[Tensor, " n"]
    cell: Int[Tensor, "n 2"]
    is_image: Tensor

    def to_dict(self) -> dict[str, Tensor]:
        return {"example": self.example, "position": self.position, "cell": self.cell,
                "is_image": self.is_image.to(torch.uint8)}

    @classmethod
    def from_dict(cls, values: dict[str, Tensor]) -> TokenSites:
        return cls(values["example"], values["position"], values["cell"], values["is_image"].bool())


@dataclass
class ActivationChunk:
    acts: Float[Tensor, "n d_in"]
    sites: TokenSites | None = None


class ActivationStream(Protocol):
    """What the trainer reads: chunks by index."""

    @property
    def n_chunks(self) -> int: ...

    @property
    def d_in(self) -> int: ...

    def chunk(self, index: int) -> ActivationChunk: ...


@dataclass
class Prompt:
    """One prompt: its images (opened) and text; its videos (each a list of frames) at `fps` frames per second."""

    images: list[Image.Image]
    text: str
    id: str = ""
    videos: list[list[Any]] = field(default_factory=list)
    fps: float = 2.0


def as_prompt(example: Any, index: int) -> Prompt:
    """A `Prompt` from a `vlens.datasets.Record`, a dict with "image"/"question" (vlens.data samples),
    an (image, text) pair or a `Prompt`."""
    if isinstance(example, Prompt):
        return example
    if isinstance(example, Record):
        return Prompt(open_images(example.images), example.prompt_text(), example.id)
    if isinstance(example, dict) and "question" in example:
        image = example.get("image")
        images = [] if image is None else list(image) if isinstance(image, (list, tuple)) else [image]
        video = example.get("video")  # one video: a list of frames (or a [T, H, W, 3] array)
        return Prompt(images, str(example["question"]), str(example.get("id", index)),
                      videos=[] if video is None else [video], fps=float(example.get("fps", 2.0)))
    if isinstance(example, tuple) and len(example) == 2:
        image, text = example
        images = [] if image is None else list(image) if isinstance(image, (list, tuple)) else [image]
        return Prompt(images, str(text), str(index))
    raise UserInputError(f"example {index}: expected a dataset Record, a dict with 'question' (and 'image'), "
                         f"or an (image, text) pair, got {type(example).__name__}.")


def hook_layer(hook_name: str) -> int | None:
    """The decoder layer a hook belongs to (None: before the blocks or after them)."""
    parts = hook_name.split(".")
    if parts[0] == "blocks" and len(parts) > 1 and parts[1].isdigit():
        return int(parts[1])
    return None


def site_mask(model: HookedVLM, inputs: Any, options: ActivationOptions) -> tuple[Tensor, Tensor, Tensor]:
    """(mask [batch, pos] of the chosen positions, cell [batch, pos, 2], is_image [batch, pos])."""
    regions = inputs.token_regions
    batch, seq = inputs.input_ids.shape
    cell = torch.full((batch, seq, 2), -1, dtype=torch.long)
    for row in range(batch):
        videos = regions.videos[row] if row < len(regions.videos) else []
        for image in range(len(regions.images[row])):
            # an image's whole-image view; a video's every frame (each token's cell in its own frame)
            views = ([r for r in regions.tiles[row][image] if r.kind == "frame"] if image in videos
                     else [regions.image_view(row, image)])
            for view in views:
                rows, cols = view.grid
                index = torch.arange(len(view.positions))
                cell[row, view.positions.cpu(), 0] = index // cols
                cell[row, view.positions.cpu(), 1] = index % cols
    is_image = regions.mask("image", seq)
    mask = regions.mask(options.positions, seq)
    if options.cells is not None:
        wanted = torch.zeros_like(mask)
        for r, c in options.cells:
            wanted |= (cell[..., 0] == r) & (cell[..., 1] == c)
        mask &= wanted & is_image
    return mask, cell, is_image


def region_mask(model: HookedVLM, inputs: Any, positions: str = "image",
                cells: Sequence[tuple[int, int]] | None = None) -> Tensor:
    """Bool [batch, pos] of a region, optionally only some (row, col) cells of each image's token grid:
    the `positions` mask to splice an SAE at (``model.run_with_saes(inputs, saes, positions=mask)``)."""
    options = ActivationOptions("", positions=positions, cells=tuple(cells) if cells is not None else None)
    return site_mask(model, model.coerce_inputs(inputs), options)[0].to(model.input_device)


class ActivationSource:
    """Activations of `options.hook_name` at the chosen positions, chunk by chunk, from `examples`.

    examples: dataset Records (`vlens.datasets.load_dataset(...).examples`), vlens.data samples
        (dicts with "image" and "question"), (image, text) pairs or `Prompt`s.
    cache_dir: keep every chunk on disk and read it back on later runs (the manifest records the
        hook, positions, chunking, number of examples and the model's weights digest; another
        setting or model is refused).
    """

    def __init__(self, model: HookedVLM, examples: Sequence[Any], options: ActivationOptions,
                 cache_dir: str | os.PathLike | None = None):
        model.check_hook_name(options.hook_name)
        if not examples:
            raise UserInputError("ActivationSource needs at least one example.")
        self.model, self.examples, self.options = model, list(examples), options
        self.cache_dir = Path(cache_dir) if cache_dir is not None else None
        self._d_in: int | None = None
        if self.cache_dir is not None:
            self._check_manifest()

    @property
    def n_chunks(self) -> int:
        return -(-len(self.examples) // self.options.prompts_per_chunk)

    @property
    def d_in(self) -> int:
        if self._d_in is None:
            self._d_in = int(self.chunk(0).acts.shape[-1])
        return self._d_in

    def manifest(self) -> dict[str, Any]:
        return {"options": asdict(self.options), "n_examples": len(self.examples),
                "model": weights_digest(self.model), "format": 1}

    def _check_manifest(self) -> None:
        assert self.cache_dir is not None
        path = self.cache_dir / "manifest.json"
        want = json.loads(json.dumps(self.manifest()))
        if path.exists():
            have = read_json_file(path, "the activation cache manifest", f"delete {self.cache_dir} to cache them again")
            if have != want:
                raise UserInputError(f"{self.cache_dir} caches other activations ({have.get('options')}, "
                                     f"{have.get('n_examples')} examples): use another cache folder or delete it.")
        else:
            self.cache_dir.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(want, indent=1) + "\n", encoding="utf-8")

    def chunk(self, index: int) -> ActivationChunk:
        """Chunk `index`: activations [n, d_in] (float32, on the CPU) and their `TokenSites`."""
        if not 0 <= index < self.n_chunks:
            raise IndexError(f"chunk {index} of {self.n_chunks}")
        cached = self.cache_dir / f"chunk_{index:06d}.safetensors" if self.cache_dir is not None else None
        if cached is not None and cached.exists():
            values = load_file(str(cached))
            return ActivationChunk(values.pop("acts"), TokenSites.from_dict(values))
        chunk = self.compute(index)
        if cached is not None:
            tmp = cached.with_suffix(".tmp")
            save_file({"acts": chunk.acts.contiguous(), **(chunk.sites.to_dict() if chunk.sites else {})}, str(tmp))
            os.replace(tmp, cached)
        return chunk

    def prompts(self, index: int) -> tuple[list[int], list[Prompt]]:
        per = self.options.prompts_per_chunk
        ids = list(range(index * per, min((index + 1) * per, len(self.examples))))
        return ids, [as_prompt(self.examples[i], i) for i in ids]

    def inputs(self, prompts: Sequence[Prompt]) -> Any:
        images = [p.images for p in prompts]
        has_images = any(images)
        videos = [p.videos for p in prompts]
        rates = {p.fps for p in prompts if p.videos}
        if len(rates) > 1:
            raise UserInputError(f"the videos of one chunk of prompts have different frame rates {sorted(rates)}: "
                                 "give every video one fps (or prompts_per_chunk=1)")
        return self.model.prepare(images=images if has_images else None, prompts=[p.text for p in prompts],
                                  chat=self.options.chat, videos=videos if any(videos) else None,
                                  fps=rates.pop() if rates else 2.0)

    @torch.no_grad()
    def compute(self, index: int) -> ActivationChunk:
        ids, prompts = self.prompts(index)
        inputs = self.inputs(prompts)
        name = self.options.hook_name
        layer = hook_layer(name)
        stop = layer + 1 if layer is not None and layer + 1 < self.model.cfg.n_layers else None
        _, cache = self.model.run_with_cache(inputs, names_filter=[name], stop_at_layer=stop)
        acts = cache[name]
        acts = acts.reshape(*acts.shape[:2], -1).float().cpu()
        mask, cell, is_image = site_mask(self.model, inputs, self.options)
        rows, positions = mask.nonzero(as_tuple=True)
        sites = TokenSites(example=torch.tensor(ids, dtype=torch.long)[rows], position=positions,
                           cell=cell[rows, positions], is_image=is_image[rows, positions])
        return ActivationChunk(acts[rows, positions].contiguous(), sites)


class TensorSource:
    """A tensor of activations [n, d_in] served as chunks of `chunk_size` rows."""

    def __init__(self, acts: Float[Tensor, "n d_in"], chunk_size: int = 1024):
        if acts.ndim != 2 or acts.shape[0] == 0:
            raise UserInputError(f"TensorSource needs a non-empty [n, d_in] tensor, got shape {tuple(acts.shape)}.")
        self.acts, self.chunk_size = acts.float(), check_count(chunk_size, "chunk_size")

    @property
    def n_chunks(self) -> int:
        return -(-self.acts.shape[0] // self.chunk_size)

    @property
    def d_in(self) -> int:
        return int(self.acts.shape[1])

    def chunk(self, index: int) -> ActivationChunk:
        if not 0 <= index < self.n_chunks:
            raise IndexError(f"chunk {index} of {self.n_chunks}")
        return ActivationChunk(self.acts[index * self.chunk_size:(index + 1) * self.chunk_size])

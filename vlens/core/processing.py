"""From images + prompts (or processor outputs / HF keywords) to `VLMInputs`."""

from __future__ import annotations

import weakref
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import replace
from typing import Any, Protocol

import torch
from torch import Tensor

from vlens.core.architectures.base import ArchitectureAdapter
from vlens.core.config import VLMConfig
from vlens.core.image_regions import ImageGeometry, build_geometry
from vlens.core.inputs import VideoLayout, VLMInputs, check_input_tensors, compute_regions
from vlens.core.prompt_text import escape_special_tokens
from vlens.core.video_input import videos_per_row
from vlens.utils.errors import UserInputError
from vlens.utils.images import SOURCE_KEY, to_rgb

# image processor -> {(image size, its resolution settings): why it refuses such an image, or None}
_refusals: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_RESOLUTION_FIELDS = ("size", "min_pixels", "max_pixels", "crop_size", "patch_size", "merge_size")


class RefusedImageError(UserInputError):
    """The model's image processor refuses an image (e.g. Qwen-VL: an aspect ratio over 200);
    `index` is the image's place in the flat list of the batch's images."""

    def __init__(self, message: str, index: int | None = None):
        super().__init__(message)
        self.index = index


def image_refusal(processor: Any, image: Any) -> str | None:
    """Why the processor's image part refuses `image` (its message, one line), or None when it takes it.

    Processors refuse by an image's size (Qwen-VL: aspect ratio over 200, a side under one patch),
    so the answer is remembered per size and resolution setting: a dataset of one image size is
    checked once.
    """
    image_processor = getattr(processor, "image_processor", None)
    if image_processor is None or not hasattr(image, "size"):
        return None
    settings = tuple(repr(getattr(image_processor, name, None)) for name in _RESOLUTION_FIELDS)
    key = (tuple(image.size), settings)
    try:
        known = _refusals.setdefault(image_processor, {})
    except TypeError:  # not weak-referenceable: no memory
        known = {}
    if key not in known:
        try:
            image_processor(images=[image], return_tensors="pt")
            known[key] = None
        except (ValueError, TypeError, RuntimeError, IndexError, ZeroDivisionError, OverflowError) as error:
            known[key] = " ".join(str(error).split()) or type(error).__name__
    return known[key]


def refused_message(what: str, image: Any, reason: str) -> str:
    width, height = image.size
    return (f"{what} ({width} x {height} px): the model's image processor refuses it ({reason}); crop or pad it to a "
            "less extreme shape, or leave it out")


class PreparingModel(Protocol):
    """What input preparation reads from a model (`HookedVLM` has all of it)."""

    @property
    def cfg(self) -> VLMConfig: ...

    @property
    def adapter(self) -> ArchitectureAdapter: ...

    @property
    def processor(self) -> Any: ...

    @property
    def tokenizer(self) -> Any: ...

    @property
    def W_U(self) -> Tensor: ...

    @property
    def input_device(self) -> torch.device: ...


def _images_per_row(images: Any, batch: int) -> list[list]:
    """Normalise `images` to one (possibly empty) list of images per prompt."""
    if images is None:
        return [[] for _ in range(batch)]
    if not isinstance(images, (list, tuple)):
        images = [images]
    if len(images) != batch:
        raise UserInputError(
            f"Got {len(images)} image entries for {batch} prompts. Give one entry per prompt: an image, "
            "a list of images, or None for a text-only prompt."
        )
    rows: list[list] = []
    for entry in images:
        if entry is None:
            rows.append([])
        elif isinstance(entry, (list, tuple)):
            rows.append(list(entry))
        else:
            rows.append([entry])
    return rows


def chat_messages(prompt: str, n_images: int = 1, n_videos: int = 0, text_first: bool = False) -> list[dict]:
    """One user turn in the chat-template format: `n_images` image slots, `n_videos` video slots, then the text
    (`text_first`: the text, then the slots; under causal attention the image tokens then see the text)."""
    content: list[dict] = [{"type": "image"} for _ in range(n_images)]
    content += [{"type": "video"} for _ in range(n_videos)]
    text = {"type": "text", "text": prompt}
    content = [text, *content] if text_first else [*content, text]
    return [{"role": "user", "content": content}]


def chat_prompt(model: PreparingModel, prompt: str, n_images: int, n_videos: int = 0) -> str:
    """The prompt text a chat model gets: its processor's chat template (with the generation
    prompt), or the family's own format when the processor has no template (videos then go first)."""
    processor = model.processor
    prompt = escape_special_tokens(model.tokenizer, prompt)  # dataset text cannot forge chat turns
    template = getattr(processor, "chat_template", None) or getattr(getattr(processor, "tokenizer", None),
                                                                    "chat_template", None)
    if template:
        return processor.apply_chat_template(chat_messages(prompt, n_images, n_videos), add_generation_prompt=True,
                                             tokenize=False)
    slots = model.adapter.video_placeholder() * n_videos if n_videos else ""
    return model.adapter.fallback_chat_prompt(slots + prompt, n_images)


@contextmanager
def left_padding(tokenizer: Any) -> Iterator[Any]:
    """Pad on the left inside the block (generation continues from the last column); the
    tokenizer's own side is restored on exit, also on error."""
    previous = tokenizer.padding_side
    tokenizer.padding_side = "left"
    try:
        yield tokenizer
    finally:
        tokenizer.padding_side = previous


def prepare_inputs(model: PreparingModel, images: Any = None, prompts: str | Sequence[str] = (),
                   chat: bool = True, allow_urls: bool = False, videos: Any = None, fps: float = 2.0) -> VLMInputs:
    """Format prompts (chat template or the family's format), run the processor, add regions.

    The batch is left-padded so the final prompt position is the last column of every row. Videos
    (`vlens.core.video_input`): one entry per prompt, each a video, a list of videos or None; `fps`
    is the rate at which the given frames were sampled (their times in the regions, Qwen's time positions).
    """
    if model.processor is None:
        raise UserInputError(
            "prepare() needs a processor. Load with HookedVLM.from_pretrained(folder_with_processor) or "
            "pass processor= to HookedVLM.from_hf(...)."
        )
    prompts = [prompts] if isinstance(prompts, str) else list(prompts)
    if not prompts:
        raise UserInputError("prepare() got no prompts: pass prompts=['How many dots are there?', ...].")
    rows = _images_per_row(images, len(prompts))
    video_rows = videos_per_row(videos, len(prompts), allow_urls)
    if any(video_rows) and not model.adapter.takes_video():
        raise UserInputError(model.adapter.video_refusal())
    placeholder = model.adapter.image_placeholder()
    texts = []
    for prompt, row_images, row_videos in zip(prompts, rows, video_rows, strict=True):
        if chat:
            texts.append(chat_prompt(model, prompt, len(row_images), len(row_videos)))
        elif row_images and placeholder not in prompt:
            texts.append(placeholder * len(row_images) + prompt)
        else:
            texts.append(prompt)
        if row_videos and not chat and model.adapter.video_placeholder() not in prompt:
            texts[-1] = model.adapter.video_placeholder() * len(row_videos) + texts[-1]
    video_inputs = expand_video_placeholders(model, texts, video_rows, fps) if any(video_rows) else {}
    # 16-bit, float, palette and alpha images scaled / composited correctly (vlens.utils.images)
    rgb = [[to_rgb(img, allow_urls=allow_urls, what=f"image {i} of prompt {p}") for i, img in enumerate(row)]
           for p, row in enumerate(rows)]
    # the family decides how per-prompt images reach its processor (LLaVA-OneVision: one list per prompt)
    kwargs: dict[str, Any] = {}
    images_arg = model.adapter.processor_images(rgb) if any(rgb) else None
    bos = getattr(model.tokenizer, "bos_token", None)
    if bos and all(text.startswith(bos) for text in texts):
        # a chat format that writes the BOS itself (Gemma's): the tokenizer must not add a second one
        kwargs["add_special_tokens"] = False
    try:
        with left_padding(model.tokenizer):
            encoded = model.adapter.process(model.processor, texts, images_arg, **kwargs)
    except (ValueError, TypeError, RuntimeError, IndexError, ZeroDivisionError, OverflowError):
        # name the image the processor refuses, if that is why
        raise_if_refused(model.processor, [image for row in rgb for image in row])
        raise
    encoded = dict(encoded)
    if video_inputs:
        encoded.update(video_inputs)
        encoded.pop("mm_token_type_ids", None)  # a generic processor marks only images: the adapter's has videos
    out = coerce_inputs(model, encoded)
    add_image_geometry(model, out, [image.size for row in rgb for image in row])
    if video_inputs and out.regions is not None:
        out.video_fps = [float(fps)] * sum(len(row) for row in video_rows)
        out.regions.frame_times = frame_times(model, out)
    return out


def expand_video_placeholders(model: PreparingModel, texts: list[str], video_rows: list[list[list]],
                              fps: float) -> dict[str, Any]:
    """Run the family's video processing and expand each video slot of `texts` (in place) as HF's processor
    does; returns the video tensors (pixel_values_videos, video_grid_thw, ...)."""
    flat = [video for row in video_rows for video in row]
    video_inputs = model.adapter.process_videos(model.processor, flat, fps)
    slot = model.adapter.video_placeholder()
    marker = "<<vlens-video>>"  # so an expanded video is not expanded again
    index = 0
    for row, (text, row_videos) in enumerate(zip(texts, video_rows, strict=True)):
        if text.count(slot) != len(row_videos):
            raise UserInputError(
                f"prompt {row} holds {text.count(slot)} video slot(s) {slot!r} for {len(row_videos)} video(s): the "
                "chat template must write one per video (a template without a video branch writes none); pass "
                "chat=False and put one slot per video in the prompt")
        for _ in row_videos:
            text = text.replace(slot, marker, 1)
            text = text.replace(marker, model.adapter.video_prompt(model.processor, video_inputs, index, fps, len(flat[index])), 1)
            index += 1
        texts[row] = text
    return video_inputs


def frame_times(model: PreparingModel, inputs: VLMInputs) -> list[list[list[float]]]:
    """Per row, per video, the start time in seconds of each frame record (frame k: k * frames per record / fps)."""
    regions = inputs.token_regions
    per_record = model.adapter.frames_per_video_token(model.cfg)
    rates = iter(inputs.video_fps or [])
    out = []
    for row_frames in regions.frames:
        row = []
        for frames in row_frames:
            rate = next(rates, None)
            row.append([k * per_record / rate for k in range(len(frames))] if rate else [])
        out.append(row)
    return out


def add_image_geometry(model: PreparingModel, inputs: VLMInputs, sizes: Sequence[tuple[int, int]] | None) -> None:
    """Fill `inputs.regions.geometry`: each image token's pixel box in its original image (the adapter's
    `token_pixel_boxes` on every spatial record), from each given image's original (width, height).

    Where the processor makes several prompt images of one image (`image_views`: Gemma 3's pan-and-scan
    crops), they are views of it: each of them gets the geometry of all of them ("crop" views offset by
    the crop's place). Left empty where the sizes are unknown or do not match the images the model sees.
    """
    regions = inputs.regions
    if regions is None or not sizes:
        return
    sizes = [(int(w), int(h)) for w, h in sizes]
    videos = regions.videos or [[] for _ in regions.images]  # a video's entries have no image size
    slots = [(row, image) for row in range(len(regions.images)) for image in range(len(regions.images[row]))
             if image not in videos[row]]
    views = model.adapter.image_views(model.processor, sizes) or [(k, (0, 0, w, h)) for k, (w, h) in enumerate(sizes)]
    if len(views) != len(slots):
        return
    geometry: list[list[ImageGeometry | None]] = [[None] * len(images) for images in regions.images]
    for source, size in enumerate(sizes):
        members = [k for k, (of, _) in enumerate(views) if of == source]
        records, boxes = [], []
        for k in members:
            row, image = slots[k]
            x0, y0, x1, y1 = views[k][1]
            crop = (x0, y0, x1, y1) != (0, 0, size[0], size[1])
            for record in regions.tiles[row][image] if regions.tiles else [regions.image_view(row, image)]:
                if record.spatial:
                    cells = model.adapter.token_pixel_boxes(model.processor, (x1 - x0, y1 - y0), record)
                    records.append(replace(record, kind="crop") if crop else record)
                    boxes.append(cells + torch.tensor([x0, y0, x0, y0], dtype=cells.dtype))
        if members:
            shared = build_geometry(slots[members[0]][0], members[0], size, records, boxes)
            for k in members:
                geometry[slots[k][0]][slots[k][1]] = shared
    regions.geometry = geometry


def video_layout(model: PreparingModel, inputs: VLMInputs) -> VideoLayout | None:
    """The batch's videos as `compute_regions` reads them (None without video inputs)."""
    video_token_id = model.cfg.video_token_id
    if inputs.pixel_values_videos is None or video_token_id is None:
        return None
    counts, grids = model.adapter.video_token_counts(model.cfg, inputs)
    return VideoLayout(video_token_id, counts, grids, model.adapter.video_tiles(model.cfg, inputs), [])


def raise_if_refused(processor: Any, images: Sequence[Any]) -> None:
    """Raise `RefusedImageError` naming the first of `images` the processor refuses (`image_refusal`)."""
    for index, image in enumerate(images):
        reason = image_refusal(processor, image)
        if reason is not None:
            source = getattr(image, "info", {}).get(SOURCE_KEY)
            what = f"image {source}" if source else f"image {index} of the batch"
            raise RefusedImageError(refused_message(what, image, reason), index) from None


def coerce_inputs(model: PreparingModel, inputs: Any = None, **hf_kwargs: Any) -> VLMInputs:
    """`VLMInputs` from VLMInputs, a mapping (processor output) or HF keyword arguments.

    Fills what HF would leave implicit: attention_mask (all ones), mm_token_type_ids (from the
    placeholder ids: HF silently falls back to 1-D positions without it; we never do) and regions.
    """
    if isinstance(inputs, VLMInputs):
        if hf_kwargs:
            raise UserInputError(f"Got VLMInputs and extra keywords {sorted(hf_kwargs)}; pass one or the other.")
        out = inputs
    else:
        if isinstance(inputs, Mapping):
            merged = {**dict(inputs), **hf_kwargs}
        elif isinstance(inputs, Tensor):
            merged = {"input_ids": inputs, **hf_kwargs}
        elif inputs is None:
            merged = dict(hf_kwargs)
        else:
            raise TypeError(f"Cannot run the model on a {type(inputs).__name__}: pass VLMInputs, a processor "
                            "output, or input_ids=..., pixel_values=..., image_grid_thw=... keywords.")
        if merged.get("input_ids") is None:
            raise UserInputError("No input_ids given. Build inputs with model.prepare(images=..., prompts=...).")
        known = {k: merged.pop(k, None) for k in VLMInputs.HF_KEYS}
        pixel_key = model.adapter.hf_pixel_values_key
        if pixel_key != "pixel_values" and merged.get(pixel_key) is not None:  # HF's processor output, as HF names it
            if known["pixel_values"] is not None:
                raise UserInputError(f"Got both pixel_values and {pixel_key} (the same images under this family's HF "
                                     "name): pass one of them.")
            known["pixel_values"] = merged.pop(pixel_key)
        input_ids = known["input_ids"]
        if input_ids.ndim == 1:
            input_ids = input_ids.unsqueeze(0)
        mask = known["attention_mask"]
        out = VLMInputs(
            input_ids=input_ids,
            attention_mask=torch.ones_like(input_ids) if mask is None else mask,
            pixel_values=known["pixel_values"],
            image_grid_thw=known["image_grid_thw"],
            mm_token_type_ids=known["mm_token_type_ids"],
            extra=merged,
            pixel_values_videos=known["pixel_values_videos"],
            video_grid_thw=known["video_grid_thw"],
            second_per_grid_ts=known["second_per_grid_ts"],
        )
    out.hf_pixel_key = model.adapter.hf_pixel_values_key
    out.pixel_values_per_row = model.adapter.pixel_values_per_row
    check_input_tensors(out, max(model.cfg.d_vocab, model.cfg.d_vocab_in), model.cfg.n_ctx)
    model.adapter.check_inputs(model.cfg, out)
    if out.pixel_values is not None and out.pixel_entries is None:
        out.pixel_entries = model.adapter.pixel_entries_per_image(model.cfg, out)
    if out.mm_token_type_ids is None:
        out.mm_token_type_ids = model.adapter.mm_token_type_ids(model.cfg, out.input_ids)
    image_token_id = model.cfg.image_token_id
    if out.regions is None and image_token_id is not None:
        # placeholders without pixel_values get no regions: start_run raises the clear error for them
        videos = video_layout(model, out)
        if out.pixel_values is not None or videos is not None:
            counts, grids = model.adapter.image_token_counts(model.cfg, out) if out.pixel_values is not None else ([], [])
            out.regions = compute_regions(out.input_ids.cpu(), out.attention_mask.cpu(), image_token_id,
                                          counts, grids,
                                          model.adapter.image_tiles(model.cfg, out) if counts else None,
                                          model.adapter.image_markers(model.cfg, out) if counts else None,
                                          videos)
            if out.pixel_values is not None:
                add_image_geometry(model, out, model.adapter.original_image_sizes(out))
        elif not bool((out.input_ids == image_token_id).any()):
            out.regions = compute_regions(out.input_ids.cpu(), out.attention_mask.cpu(), image_token_id, [], [])
    device = model.input_device
    return out.to(device) if out.input_ids.device != device else out

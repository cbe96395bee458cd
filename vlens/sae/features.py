"""What each SAE feature responds to and what it writes: top images (activation over the image
patches), top text positions, the tokens it promotes through the unembedding.

One pass over the examples (an `ActivationSource` at every position) keeps, per feature, its
firing frequency, its top-k examples by largest image-token activation and its top-k text
positions; a second pass over only the chosen features' top examples records their activation on
every image-grid cell. Promoted tokens are the largest entries of ``W_dec[f] @ W_U`` (the
feature's decoder direction read by the unembedding, as in direct logit attribution; only when the
SAE reads a residual-stream hook, d_in == d_model).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from PIL import Image
from torch import Tensor

from vlens.core.model import HookedVLM
from vlens.sae.activations import ActivationOptions, ActivationSource, as_prompt
from vlens.sae.base import SAE
from vlens.utils.errors import UserInputError
from vlens.utils.results import Result
from vlens.utils.validation import check_count


@dataclass
class ImageHit:
    example: int
    max_activation: float
    grid: tuple[int, int]
    cells: list[float]  # activation per image-grid cell, row-major


@dataclass
class TextHit:
    example: int
    position: int
    activation: float
    token: str
    context: list[str]  # the tokens around it; the hit is context[focus]
    focus: int


@dataclass
class FeatureView:
    feature: int
    frequency: float  # share of tokens (at the source's positions) where it fires
    image_frequency: float
    text_frequency: float
    top_images: list[ImageHit] = field(default_factory=list)
    top_text: list[TextHit] = field(default_factory=list)
    promoted: list[tuple[str, float]] = field(default_factory=list)
    suppressed: list[tuple[str, float]] = field(default_factory=list)


@dataclass
class FeatureViews(Result):
    """The views of some features of one SAE (`to_dict` for results.json; `plot` is the frequency histogram)."""

    hook_name: str
    d_sae: int
    views: list[FeatureView]
    n_tokens: int
    examples: list[str] = field(default_factory=list)  # each example's id

    kind: ClassVar[str] = "sae_features"

    def saved_key(self, name: str) -> str:
        """The key of results.json that field `name` is saved under (the views: "features", one per view)."""
        return "features" if name == "views" else name

    def to_dict(self) -> dict:
        return {"kind": "sae_features", "hook_name": self.hook_name, "d_sae": self.d_sae, "n_tokens": self.n_tokens,
                "examples": self.examples, "features": [_view_dict(v) for v in self.views]}

    @classmethod
    def from_dict(cls, data: dict) -> FeatureViews:
        return cls(hook_name=data["hook_name"], d_sae=int(data["d_sae"]), n_tokens=int(data["n_tokens"]),
                   examples=list(data.get("examples", [])), views=[_view_from_dict(v) for v in data["features"]])

    def plot(self, *args: Any, **kwargs: Any) -> Any:
        import plotly.graph_objects as go

        return go.Figure(go.Bar(x=[f"f{v.feature}" for v in self.views], y=[v.frequency for v in self.views]))


def _view_dict(view: FeatureView) -> dict:
    return {"feature": view.feature, "frequency": view.frequency, "image_frequency": view.image_frequency,
            "text_frequency": view.text_frequency,
            "top_images": [vars(hit) | {"grid": list(hit.grid)} for hit in view.top_images],
            "top_text": [vars(hit) for hit in view.top_text],
            "promoted": [list(p) for p in view.promoted], "suppressed": [list(p) for p in view.suppressed]}


def _view_from_dict(data: dict) -> FeatureView:
    """The inverse of `_view_dict`."""
    return FeatureView(
        feature=int(data["feature"]), frequency=data["frequency"], image_frequency=data["image_frequency"],
        text_frequency=data["text_frequency"],
        top_images=[ImageHit(**{**hit, "grid": (int(hit["grid"][0]), int(hit["grid"][1]))})
                    for hit in data.get("top_images", [])],
        top_text=[TextHit(**hit) for hit in data.get("top_text", [])],
        promoted=[(str(t), float(v)) for t, v in data.get("promoted", [])],
        suppressed=[(str(t), float(v)) for t, v in data.get("suppressed", [])])


def merge_top(values: Tensor, index: Tensor, new_values: Tensor, new_index: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """Per feature (rows), the k largest of the kept and the new values."""
    all_values, all_index = torch.cat([values, new_values], dim=1), torch.cat([index, new_index], dim=1)
    top = torch.topk(all_values, min(k, all_values.shape[1]), dim=1)
    return top.values, torch.gather(all_index, 1, top.indices)


def promoted_tokens(model: HookedVLM, sae: SAE, features: Sequence[int], k: int = 8
                    ) -> dict[int, tuple[list[tuple[str, float]], list[tuple[str, float]]]]:
    """Per feature, the (token, value) pairs of ``W_dec[f] @ W_U`` largest and smallest; {} when
    the SAE does not read the residual stream (d_in != d_model)."""
    if sae.cfg.d_in != model.cfg.d_model:
        return {}
    with torch.no_grad():
        logits = sae.W_dec[list(features)].float() @ model.W_U.float().to(sae.W_dec.device)
    out = {}
    for row, feature in enumerate(features):
        top, bottom = torch.topk(logits[row], k), torch.topk(-logits[row], k)
        out[feature] = ([(str(model.to_string([int(i)])), float(v)) for v, i in zip(top.values, top.indices, strict=True)],
                        [(str(model.to_string([int(i)])), -float(v)) for v, i in zip(bottom.values, bottom.indices,
                                                                               strict=True)])
    return out


@dataclass(frozen=True)
class FeatureViewOptions:
    """features: which to view (None: the `n_features` that fire most often); top_k: hits per view;
    context: tokens on each side of a text hit; prompts_per_chunk: prompts per forward."""

    features: tuple[int, ...] | None = None
    n_features: int = 32
    top_k: int = 6
    context: int = 4
    prompts_per_chunk: int = 8


@torch.no_grad()
def feature_views(model: HookedVLM, sae: SAE, examples: Sequence[Any], options: FeatureViewOptions | None = None,
                  hook_name: str | None = None) -> FeatureViews:
    """The `FeatureView`s of an SAE over `examples` (Records, vlens.data samples, (image, text) pairs)."""
    options = options or FeatureViewOptions()
    hook = hook_name or sae.cfg.hook_name
    if hook is None:
        raise UserInputError("the SAE names no hook (cfg.hook_name): pass hook_name.")
    check_count(options.top_k, "top_k")
    d_sae, k = sae.cfg.d_sae, options.top_k
    if options.features is not None:
        bad = [f for f in options.features if not 0 <= f < d_sae]
        if bad:
            raise UserInputError(f"features {bad} are not in [0, {d_sae}).")
    source = ActivationSource(model, examples, ActivationOptions(hook, positions="all",
                                                                 prompts_per_chunk=options.prompts_per_chunk))
    fired_image = torch.zeros(d_sae)
    fired_text = torch.zeros(d_sae)
    n_image = n_text = 0
    empty = torch.zeros(d_sae, 0)
    img_val, img_idx = empty, empty.long()
    txt_val, txt_idx = empty, empty.long()
    sites_example, sites_position = [], []
    offset = 0
    for index in range(source.n_chunks):
        chunk = source.chunk(index)
        assert chunk.sites is not None
        acts = sae.encode(chunk.acts).float().cpu()
        image = chunk.sites.is_image
        fired_image += (acts[image] > 0).float().sum(0)
        fired_text += (acts[~image] > 0).float().sum(0)
        n_image, n_text = n_image + int(image.sum()), n_text + int((~image).sum())
        if bool(image.any()):  # per example: the largest activation over its image tokens
            ids = chunk.sites.example[image]
            per_example = torch.zeros(int(ids.max()) + 1, d_sae).scatter_reduce(
                0, ids[:, None].expand(-1, d_sae), acts[image], "amax", include_self=False)
            present = torch.unique(ids)
            img_val, img_idx = merge_top(img_val, img_idx, per_example[present].T,
                                          present.expand(d_sae, -1), k)
        if bool((~image).any()):
            rows = torch.nonzero(~image).flatten()
            txt_val, txt_idx = merge_top(txt_val, txt_idx, acts[rows].T, (rows + offset).expand(d_sae, -1), k)
        sites_example.append(chunk.sites.example)
        sites_position.append(chunk.sites.position)
        offset += len(chunk.sites.example)
    n_tokens = n_image + n_text
    frequency = (fired_image + fired_text) / max(1, n_tokens)
    features = list(options.features) if options.features is not None else \
        torch.topk(frequency, min(options.n_features, d_sae)).indices.tolist()
    all_examples, all_positions = torch.cat(sites_example), torch.cat(sites_position)
    promoted = promoted_tokens(model, sae, features)
    maps = _image_maps(model, sae, examples, hook, {int(i) for f in features for i, v in
                                                     zip(img_idx[f].tolist(), img_val[f].tolist(), strict=True)
                                                     if v > 0}, options.prompts_per_chunk)
    views = []
    for f in features:
        view = FeatureView(feature=f, frequency=float(frequency[f]),
                           image_frequency=float(fired_image[f] / max(1, n_image)),
                           text_frequency=float(fired_text[f] / max(1, n_text)))
        for value, example in zip(img_val[f].tolist(), img_idx[f].tolist(), strict=True):
            if value > 0 and example in maps:
                grid, cells = maps[example]
                view.top_images.append(ImageHit(example, value, grid, cells[:, f].tolist()))
        for value, site in zip(txt_val[f].tolist(), txt_idx[f].tolist(), strict=True):
            if value > 0:
                view.top_text.append(_text_hit(model, source, int(all_examples[site]), int(all_positions[site]),
                                               value, options.context))
        if f in promoted:
            view.promoted, view.suppressed = promoted[f]
        views.append(view)
    names = [str(getattr(e, 'id', None) or (e.get('id') if isinstance(e, dict) else None) or i)
             for i, e in enumerate(examples)]
    return FeatureViews(hook, d_sae, views, n_tokens, names)


def _image_maps(model: HookedVLM, sae: SAE, examples: Sequence[Any], hook: str, wanted: set[int],
                per_chunk: int) -> dict[int, tuple[tuple[int, int], Tensor]]:
    """For each wanted example: (its first image's grid, activations [cells, d_sae] on that grid)."""
    order = sorted(wanted)
    if not order:
        return {}
    source = ActivationSource(model, [examples[i] for i in order], ActivationOptions(hook, positions="image",
                                                                                     prompts_per_chunk=per_chunk))
    out: dict[int, tuple[tuple[int, int], Tensor]] = {}
    for index in range(source.n_chunks):
        chunk = source.chunk(index)
        assert chunk.sites is not None
        acts = sae.encode(chunk.acts).float().cpu()
        for local in torch.unique(chunk.sites.example).tolist():
            rows = chunk.sites.example == local
            cells = chunk.sites.cell[rows]
            first_image = _first_image_rows(chunk.sites.position[rows], cells)
            cells, values = cells[first_image], acts[rows][first_image]
            grid = (int(cells[:, 0].max()) + 1, int(cells[:, 1].max()) + 1)
            dense = torch.zeros(grid[0] * grid[1], acts.shape[1])
            dense[cells[:, 0] * grid[1] + cells[:, 1]] = values
            out[order[local]] = (grid, dense)
    return out


def _first_image_rows(positions: Tensor, cells: Tensor) -> Tensor:
    """The rows of an example's first image (its tokens run until the grid starts again at (0, 0))."""
    starts = ((cells[:, 0] == 0) & (cells[:, 1] == 0)).nonzero().flatten()
    end = int(starts[1]) if len(starts) > 1 else len(positions)
    keep = torch.zeros(len(positions), dtype=torch.bool)
    keep[:end] = True
    return keep


def _text_hit(model: HookedVLM, source: ActivationSource, example: int, position: int, value: float,
              context: int) -> TextHit:
    prompt = as_prompt(source.examples[example], example)
    inputs = source.inputs([prompt])
    ids = inputs.input_ids[0].tolist()
    low, high = max(0, position - context), min(len(ids), position + context + 1)
    tokens = [str(t) for t in model.to_str_tokens(torch.tensor(ids[low:high]))]
    return TextHit(example, position, value, tokens[position - low], tokens, position - low)


def example_image(examples: Sequence[Any], index: int) -> Image.Image | None:
    """The first image of an example (for drawing), or None for a text-only one."""
    prompt = as_prompt(examples[index], index)
    return prompt.images[0] if prompt.images else None

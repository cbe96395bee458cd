"""Dataset examples for the viewer's feature cards: each feature's top image patches and text tokens over a set.

`dataset_examples(model, transcoders, examples, features)` streams a small set of prompts through the
model (the transcoders' activation source: `PairSource`'s prompts, MLP inputs and token sites), encodes
each covered layer's MLP input with its transcoder and keeps, per feature, the `top_k` image tokens and
the `top_k` text tokens with the largest activation over every prompt (ties: the earlier prompt and
position). Each hit records its prompt, its position in that prompt alone (padding removed), and for
display a text token's context or an image token's patch (a PNG crop around the token's pixel box, the
box outlined). `attach_examples(graph, ...)` stores them in the graph (results.json, graph.html's cards).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from PIL import Image, ImageDraw
from torch import Tensor
from tqdm.auto import tqdm

from vlens.core.model import HookedVLM
from vlens.sae.activations import as_prompt, site_mask
from vlens.sae.features import merge_top
from vlens.transcoders.activations import PairSource, mlp_pairs
from vlens.transcoders.model import Transcoders
from vlens.utils.errors import UserInputError
from vlens.utils.validation import check_count
from vlens.viz.sae_dashboard import png_data_uri


@dataclass(frozen=True)
class ExampleSettings:
    """top_k: hits per feature, for image tokens and for text tokens each; context: text tokens on each side of
    a text hit; patch: a patch thumbnail's size in pixels; margin: the context shown around a patch, in
    patch widths; prompts_per_chunk: prompts per forward."""

    top_k: int = 6
    context: int = 3
    patch: int = 64
    margin: float = 1.0
    prompts_per_chunk: int = 8

    def __post_init__(self) -> None:
        for name in ("top_k", "patch", "prompts_per_chunk"):
            check_count(getattr(self, name), name)
        check_count(self.context, "context", min=0)
        if not self.margin >= 0:
            raise UserInputError(f"margin must be >= 0, got {self.margin}.")


def feature_key(layer: int, feature: int) -> str:
    return f"L{layer}F{feature}"


@torch.no_grad()
def top_activations(model: HookedVLM, transcoders: Transcoders, examples: Sequence[Any],
                    features: Sequence[tuple[int, int]], top_k: int = 6, prompts_per_chunk: int = 8,
                    progress: bool = False) -> dict[str, dict[str, list[tuple[float, int, int]]]]:
    """Per feature (decoder layer, feature): {"image": [...], "text": [...]}, each the `top_k` (activation,
    prompt, position) with activation > 0, largest first; positions in the prompt alone."""
    layers = transcoders.cfg.layers
    wanted: dict[int, list[int]] = {}
    for layer, feature in features:
        if layer not in layers or not 0 <= feature < transcoders.cfg.d_tc:
            raise UserInputError(f"no transcoder feature {feature_key(layer, feature)} (layers {list(layers)}, "
                                 f"features 0 .. {transcoders.cfg.d_tc - 1}).")
        wanted.setdefault(layers.index(layer), []).append(feature)
    if not examples:
        raise UserInputError("dataset examples need at least one prompt.")
    source = PairSource(model, examples, layers=layers, positions="all", prompts_per_chunk=prompts_per_chunk)
    n = sum(len(f) for f in wanted.values())
    order = [(i, f) for i, fs in sorted(wanted.items()) for f in fs]
    empty_v, empty_i = torch.zeros(n, 0), torch.zeros(n, 0, dtype=torch.long)
    kept = {"image": (empty_v, empty_i), "text": (empty_v, empty_i)}
    sites: list[Tensor] = []  # per chunk: [n_sites, 2] (prompt, position in the prompt alone)
    offset = 0
    for index in tqdm(range(source.n_chunks), desc="dataset examples", disable=not progress, unit="chunk"):
        ids, prompts = source.prompts(index)
        inputs = source.inputs(prompts)
        xs, _ = mlp_pairs(model, inputs, [layers[i] for i in sorted(wanted)])
        mask, _, is_image = site_mask(model, inputs, source.options)
        rows, positions = mask.nonzero(as_tuple=True)
        unpadded = inputs.attention_mask.long().cumsum(-1) - 1
        sites.append(torch.stack([torch.tensor(ids, dtype=torch.long)[rows], unpadded[rows, positions].cpu()], 1))
        acts = torch.cat([transcoders.encode(i, x[rows, positions])[:, wanted[i]].float().cpu()
                          for i, x in zip(sorted(wanted), xs, strict=True)], dim=1)  # [n_sites, n]
        site_index = torch.arange(offset, offset + len(rows))
        for kind, chosen in (("image", is_image[rows, positions].cpu()), ("text", ~is_image[rows, positions].cpu())):
            if bool(chosen.any()):
                values, index_ = kept[kind]
                kept[kind] = merge_top(values, index_, acts[chosen].T, site_index[chosen].expand(n, -1), top_k)
        offset += len(rows)
    everything = torch.cat(sites) if sites else torch.zeros(0, 2, dtype=torch.long)
    out: dict[str, dict[str, list[tuple[float, int, int]]]] = {}
    for row, (i, feature) in enumerate(order):
        entry: dict[str, list[tuple[float, int, int]]] = {}
        for kind, (values, index_) in kept.items():
            entry[kind] = [(float(v), int(everything[s, 0]), int(everything[s, 1]))
                           for v, s in zip(values[row].tolist(), index_[row].tolist(), strict=True) if v > 0]
        out[feature_key(layers[i], feature)] = entry
    return out


def _patch(image: Image.Image, box: tuple[float, float, float, float], settings: ExampleSettings) -> str:
    """A PNG data URL of the token's box with `margin` box widths around it, the box outlined in red."""
    x0, y0, x1, y1 = box
    pad_x, pad_y = (x1 - x0) * settings.margin, (y1 - y0) * settings.margin
    crop_box = (max(0, int(x0 - pad_x)), max(0, int(y0 - pad_y)), min(image.width, int(round(x1 + pad_x))),
                min(image.height, int(round(y1 + pad_y))))
    crop = image.convert("RGB").crop(crop_box)
    scale = settings.patch / max(1, crop.width, crop.height)
    shown = crop.resize((max(1, round(crop.width * scale)), max(1, round(crop.height * scale))), Image.Resampling.NEAREST)
    ImageDraw.Draw(shown).rectangle([(x0 - crop_box[0]) * scale, (y0 - crop_box[1]) * scale,
                                     (x1 - crop_box[0]) * scale - 1, (y1 - crop_box[1]) * scale - 1],
                                    outline=(224, 27, 36), width=2)
    return png_data_uri(shown)


def _image_of(inputs: Any, pos: int) -> int | None:
    for k, positions in enumerate(inputs.token_regions.images[0]):
        if pos in set(positions.tolist()):
            return k
    return None


def dataset_examples(model: HookedVLM, transcoders: Transcoders, examples: Sequence[Any],
                     features: Sequence[tuple[int, int]], settings: ExampleSettings | None = None,
                     progress: bool = False) -> dict[str, Any]:
    """The viewer's dataset examples of `features` (decoder layer, feature) over `examples` (Records, vlens.data
    samples, (image, text) pairs): {"n_prompts", "top_k", "features": {"L{l}F{i}": {"image": hits, "text": hits}}};
    an image hit: activation, prompt, position, image, box (original pixels), src (the patch, a PNG data URL); a
    text hit: activation, prompt, position, token, context (tokens), focus (the hit's index in context)."""
    settings = settings or ExampleSettings()
    top = top_activations(model, transcoders, examples, features, settings.top_k, settings.prompts_per_chunk, progress)
    prepared: dict[int, tuple[Any, Any, list[str]]] = {}

    def prompt_inputs(index: int) -> tuple[Any, Any, list[str]]:
        if index not in prepared:  # the prompt alone: positions without padding
            prompt = as_prompt(examples[index], index)
            inputs = model.prepare(images=[prompt.images] if prompt.images else None, prompts=[prompt.text])
            tokens = [str(t) for t in model.to_str_tokens(inputs.input_ids[0])]
            prepared[index] = (prompt, inputs, tokens)
        return prepared[index]

    out: dict[str, Any] = {}
    for key, hits in top.items():
        entry: dict[str, list[dict[str, Any]]] = {"image": [], "text": []}
        for value, index, pos in hits["image"]:
            prompt, inputs, tokens = prompt_inputs(index)
            image = _image_of(inputs, pos)
            hit: dict[str, Any] = {"activation": value, "prompt": index, "position": pos, "image": image,
                                   "token": tokens[pos]}
            if image is not None and image < len(prompt.images):
                try:
                    box = inputs.token_regions.token_box(image, pos)
                except (UserInputError, IndexError, ValueError):
                    box = None  # a token with no pixel box (a tile separator, a latent)
                if box is not None:
                    hit["box"] = [float(b) for b in box]
                    hit["src"] = _patch(prompt.images[image], box, settings)
            entry["image"].append(hit)
        for value, index, pos in hits["text"]:
            _, _, tokens = prompt_inputs(index)
            low, high = max(0, pos - settings.context), min(len(tokens), pos + settings.context + 1)
            entry["text"].append({"activation": value, "prompt": index, "position": pos, "token": tokens[pos],
                                  "context": tokens[low:high], "focus": pos - low})
        out[key] = entry
    return {"n_prompts": len(examples), "top_k": settings.top_k, "features": out}


def attach_examples(graph: Any, model: HookedVLM, transcoders: Transcoders, examples: Sequence[Any],
                    settings: ExampleSettings | None = None, every_feature: bool = False, progress: bool = False) -> Any:
    """Compute the dataset examples of the graph's features (those the pruned graph keeps, the viewer's; every
    attributed feature with `every_feature`) and store them in `graph.examples`; returns the graph."""
    if every_feature:
        chosen = [node for node in graph.nodes if node["kind"] == "feature"]
    else:
        keep = graph.prune().nodes
        chosen = [node for node, kept in zip(graph.nodes, keep.tolist(), strict=True) if kept and node["kind"] == "feature"]
    features = sorted({(int(node["layer"]), int(node["feature"])) for node in chosen})
    graph.examples = dataset_examples(model, transcoders, examples, features, settings, progress) if features else \
        {"n_prompts": len(examples), "top_k": (settings or ExampleSettings()).top_k, "features": {}}
    return graph


__all__ = ["ExampleSettings", "attach_examples", "dataset_examples", "top_activations"]

"""One call from a model and its inputs to an offline circuitsvis page of a layer's attention.

`attention_patterns(model, inputs, layer, path=...)` caches the layer's ``hook_pattern``, labels
every token (image tokens by their grid cell, ``img0[r2,c3]``; tiles and other image tokens by
what they are) and writes one self-contained HTML file: the circuitsvis JavaScript bundle is
inlined (circuitsvis's own ``str(view)`` loads it from a CDN, which is blank offline), nothing is
fetched. `image_token_labels` gives the labels alone.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import torch

from vlens.utils.errors import UserInputError
from vlens.utils.fileio import atomic_write_text
from vlens.viz.circuits import (
    attention_heads_view,
    attention_patterns_view,
    circuitsvis_bundle_js,
    circuitsvis_html,
)
from vlens.viz.html import inline_script


class AttentionPage(str):
    """The page's HTML (a `str`, usable as one) that shows a one-line summary as its repr and
    renders itself in a notebook, instead of echoing megabytes of HTML."""

    layer: int
    n_heads: int
    n_positions: int
    path: Path | None

    def __repr__(self) -> str:
        where = f", written to {self.path}" if self.path is not None else ""
        return (f"AttentionPage(layer {self.layer}, {self.n_heads} heads, {self.n_positions} positions, "
                f"{len(self) / 1e6:.1f} MB of HTML{where})")

    def _repr_html_(self) -> str:
        return str.__str__(self)


def image_token_labels(model: Any, inputs: Any, row: int = 0) -> list[str]:
    """One readable label per position of batch row `row` of `inputs` (`VLMInputs` from `prepare`).

    Text tokens read as `model.to_str_tokens` decodes them (newlines as ``\\n``); the tokens of
    image i are ``img{i}[r{row},c{col}]`` by cell of the grid that covers the whole image; an anyres
    or split image's tiles are ``img{i}.tile{k}[r,c]`` (k in the processor's order), a video's frames
    (temporal patches) ``img{i}.f{k}[r,c]`` (a video is entry i of the row's images), other image
    tokens (class token, row newlines) ``img{i}.{kind}{j}``. Padding positions keep their token.
    """
    regions = getattr(inputs, "regions", None)
    if not 0 <= row < inputs.input_ids.shape[0]:
        raise UserInputError(f"row {row} is not a row of this batch of {inputs.input_ids.shape[0]}.")
    labels = [str(t).replace("\n", "\\n").replace("\t", "\\t") for t in model.to_str_tokens(inputs.input_ids[row])]
    if regions is None:
        return labels
    records = regions.tiles[row] if row < len(regions.tiles) else []
    for image, positions in enumerate(regions.images[row]):
        if image < len(records) and records[image]:
            tiles = 0
            for record in records[image]:
                where = [int(p) for p in record.positions.tolist()]
                if record.kind == "frame":  # a video's frame (temporal patch): img{i}.f{k}[r,c]
                    cols = record.grid[1]
                    names = [f"img{image}.f{record.index}[r{c // cols},c{c % cols}]" for c in range(len(where))]
                elif record.spatial and record.kind != "tile":
                    cols = record.grid[1]
                    names = [f"img{image}[r{c // cols},c{c % cols}]" for c in range(len(where))]
                elif record.spatial:
                    cols = record.grid[1]
                    names = [f"img{image}.tile{tiles}[r{c // cols},c{c % cols}]" for c in range(len(where))]
                    tiles += 1
                else:
                    names = [f"img{image}.{record.kind}{j}" for j in range(len(where))]
                for position, name in zip(where, names, strict=True):
                    labels[position] = name
        else:  # regions without tile records: one grid over the image
            rows, cols = regions.image_grid[row][image]
            for cell, position in enumerate(positions.tolist()[: rows * cols]):
                labels[int(position)] = f"img{image}[r{cell // cols},c{cell % cols}]"
    return labels


def attention_patterns(model: Any, inputs: Any, layer: int, path: str | Path | None = None, row: int = 0,
                       positions: Sequence[int] | None = None, view: Literal["heads", "patterns"] = "heads",
                       title: str | None = None) -> AttentionPage:
    """A self-contained offline HTML page of layer `layer`'s attention patterns (circuitsvis).

    Args:
        model: a `HookedVLM`.
        inputs: `VLMInputs` (`model.prepare(...)`); one batch row is shown.
        layer: a softmax-attention layer (one with ``blocks.{layer}.attn.hook_pattern``).
        path: where to write the page (written whole or not at all); None: only return it.
        row: the batch row.
        positions: the query and key positions to show, in the row's coordinates (default: every
            non-padding position); a few hundred keep the page responsive.
        view: "heads" (one thumbnail per head, click to enlarge: circuitsvis ``attention_heads``)
            or "patterns" (one large pattern, hover to pick a head: ``attention_patterns``).
        title: the page's heading (default: the layer and the model's architecture).

    Returns:
        The page's HTML, an `AttentionPage` (a `str` whose repr is a one-line summary). Its only
        script is circuitsvis's bundle, inlined, and the render call;
        it loads nothing from the network. Labels: `image_token_labels`.
    """
    if view not in ("heads", "patterns"):
        raise UserInputError(f"attention_patterns: view must be 'heads' or 'patterns', got {view!r}.")
    name = f"blocks.{layer}.attn.hook_pattern"
    if name not in model.hook_dict:
        raise UserInputError(f"attention_patterns: layer {layer} has no {name} (layers 0..{model.cfg.n_layers - 1}; "
                             "a linear-attention layer has no attention pattern).")
    labels = image_token_labels(model, inputs, row)
    with torch.no_grad():
        _, cache = model.run_with_cache(inputs, names_filter=[name], return_type=None)
    pattern = cache[name][row].float().cpu()  # [n_heads, pos, pos]
    if positions is None:
        positions = inputs.attention_mask[row].bool().nonzero().flatten().tolist()
    else:
        positions = [int(p) for p in positions]
        bad = [p for p in positions if not 0 <= p < len(labels)]
        if bad or not positions:
            raise UserInputError(f"attention_patterns: positions must be non-empty, in 0..{len(labels) - 1}; got "
                                 f"{bad[:5] if bad else 'none'}.")
    if view == "heads":
        rendered = attention_heads_view(pattern, labels, layer=layer, positions=positions)
    else:
        rendered = attention_patterns_view(pattern, labels, positions=positions)
    heading = title or f"Attention patterns, layer {layer} ({model.cfg.architecture})"
    page = ("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            f"<title>{html.escape(heading)}</title>\n{inline_script(circuitsvis_bundle_js())}\n</head>\n<body>\n"
            f"<h1 style=\"font-family: sans-serif; font-size: 1.2em\">{html.escape(heading)}</h1>\n"
            f"<p style=\"font-family: sans-serif\">{len(positions)} positions; image tokens are labelled "
            f"img&lt;image&gt;[r&lt;row&gt;,c&lt;col&gt;] by grid cell.</p>\n"
            f"{circuitsvis_html(rendered, div_id=f'attention-layer-{layer}')}\n</body>\n</html>\n")
    if path is not None:
        atomic_write_text(path, page)
    summary = AttentionPage(page)
    summary.layer, summary.n_heads, summary.n_positions = layer, int(pattern.shape[0]), len(positions)
    summary.path = None if path is None else Path(path)
    return summary


__all__ = ["AttentionPage", "attention_patterns", "image_token_labels"]

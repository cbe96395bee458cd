"""circuitsvis attention views with readable labels for image tokens (`img0[r2,c3]`)."""

from __future__ import annotations

import html
import re
from collections.abc import Sequence
from pathlib import Path

from jaxtyping import Float, Int
from torch import Tensor

from vlens.utils.errors import UserInputError
from vlens.viz.checks import as_float_tensor, as_grid
from vlens.viz.html import compact_numbers
from vlens.viz.optional import require_circuitsvis_attention


def token_labels(
    token_strs: Sequence[str],
    image_positions_per_image: Sequence[Int[Tensor, " n_image_tokens"] | Sequence[int]] = (),
    grids: Sequence[tuple[int, int]] = (),
    make_unique: bool = False,
) -> list[str]:
    """One readable label per token: image tokens as `img{i}[r{row},c{col}]`, text as its string.

    Args:
        token_strs: the decoded tokens of one sequence, `len == n_pos`.
        image_positions_per_image: for each image, its token positions (row-major over its grid),
            e.g. the per-image split of `inputs.regions.image`.
        grids: for each image, its merged grid `(rows, cols)` (`inputs.regions.image_grid`).
        make_unique: append `#k` to the k-th repeat of a label. `attention_heads` does not need
            this (it suffixes the position itself), but other tools keyed by label do.

    Returns:
        `n_pos` labels. Newlines and tabs in text tokens are shown as `\\n` / `\\t`.
    """
    if len(image_positions_per_image) != len(grids):
        raise UserInputError(f"{len(image_positions_per_image)} images of positions but {len(grids)} grids")
    labels = [str(token).replace("\n", "\\n").replace("\t", "\\t") for token in token_strs]
    for image_index, (positions, grid) in enumerate(zip(image_positions_per_image, grids, strict=True)):
        rows, cols = as_grid(grid, f"grids[{image_index}]")
        positions = [int(p) for p in (positions.tolist() if isinstance(positions, Tensor) else positions)]
        if len(positions) != rows * cols:
            raise UserInputError(
                f"image {image_index} has {len(positions)} positions but its grid {rows}x{cols} "
                f"has {rows * cols} cells"
            )
        for cell, position in enumerate(positions):
            if not 0 <= position < len(labels):
                raise IndexError(f"image {image_index} position {position} outside the {len(labels)} tokens")
            labels[position] = f"img{image_index}[r{cell // cols},c{cell % cols}]"
    return _uniquify(labels) if make_unique else labels


def _uniquify(labels: list[str]) -> list[str]:
    seen: dict[str, int] = {}
    unique = []
    for label in labels:
        seen[label] = seen.get(label, 0) + 1
        unique.append(label if seen[label] == 1 else f"{label}#{seen[label] - 1}")
    return unique


def _square_pattern(pattern, tokens: Sequence[str], positions: Sequence[int] | None):
    """Check `[n_heads, q, k]` against the tokens and optionally keep only some positions."""
    pattern = as_float_tensor(pattern, "pattern (index the batch row first: pattern[0])", 3)
    n_heads, n_queries, n_keys = pattern.shape
    if n_queries != n_keys or n_keys != len(tokens):
        raise UserInputError(
            f"pattern must be [n_heads, n_pos, n_pos] with n_pos = len(tokens) = {len(tokens)}, "
            f"got {tuple(pattern.shape)}"
        )
    tokens = list(tokens)
    if positions is not None:
        # Whole image-token patterns are large (thousands of positions): view a subset.
        index = [int(p) for p in positions]
        pattern = pattern[:, index][:, :, index]
        tokens = [tokens[p] for p in index]
    return pattern, tokens


def attention_patterns_view(
    pattern: Float[Tensor, "n_heads n_pos n_pos"],
    tokens: Sequence[str],
    positions: Sequence[int] | None = None,
):
    """`circuitsvis.attention.attention_patterns` (one large pattern, hover to pick a head).

    Args:
        pattern: one sequence's pattern, `hook_pattern[b]`.
        tokens: one label per position (see `token_labels`).
        positions: optional subset of positions to show (same subset for queries and keys).

    Returns:
        The circuitsvis `RenderedHTML` (renders in notebooks; `circuitsvis_html` gives offline HTML).
    """
    attention = require_circuitsvis_attention()
    pattern, tokens = _square_pattern(pattern, tokens, positions)
    return attention.attention_patterns(tokens=tokens, attention=pattern)


def attention_heads_view(
    pattern: Float[Tensor, "n_heads n_pos n_pos"],
    tokens: Sequence[str],
    layer: int | None = None,
    head_names: Sequence[str] | None = None,
    positions: Sequence[int] | None = None,
    max_value: float | None = None,
    min_value: float | None = None,
):
    """`circuitsvis.attention.attention_heads` (one thumbnail per head, click to enlarge).

    Args:
        pattern: one sequence's pattern, `hook_pattern[b]`.
        tokens: one label per position (see `token_labels`).
        layer: names heads `L{layer}H{h}`; without it (and without `head_names`) they are `H{h}`.
        head_names: explicit names, one per head.
        positions: optional subset of positions to show.
        max_value, min_value: colour range (circuitsvis defaults when None).

    Returns:
        The circuitsvis `RenderedHTML`.
    """
    attention = require_circuitsvis_attention()
    pattern, tokens = _square_pattern(pattern, tokens, positions)
    n_heads = pattern.shape[0]
    if head_names is None:
        prefix = "" if layer is None else f"L{layer}"
        head_names = [f"{prefix}H{h}" for h in range(n_heads)]
    if len(head_names) != n_heads:
        raise UserInputError(f"{len(head_names)} head names for {n_heads} heads")
    return attention.attention_heads(
        attention=pattern,
        tokens=tokens,
        attention_head_names=list(head_names),
        max_value=max_value,
        min_value=min_value,
    )


_RENDER_CALL = re.compile(
    r'CircuitsVis\.render\(\s*"(?P<uuid>[^"]+)",\s*CircuitsVis\.(?P<component>\w+),\s*(?P<props>.*)\)\s*</script>',
    re.DOTALL,
)


def circuitsvis_bundle_js() -> str:
    """The circuitsvis JavaScript bundle (defines the global `CircuitsVis`), safe inside `<script>`."""
    import circuitsvis

    bundle = Path(circuitsvis.__file__).parent / "dist" / "cdn" / "iife.js"
    text = bundle.read_text(encoding="utf-8").replace("</script>", "")
    # The source map is not shipped with the report; drop the reference to it.
    return re.sub(r"//# sourceMappingURL=\S+\s*$", "", text)


def circuitsvis_html(view, div_id: str | None = None) -> str:
    """The HTML of a circuitsvis view without its JavaScript bundle, for offline pages with many views.

    The snippet is a `<div>` plus a small `<script>` calling `CircuitsVis.render`; it works once
    the page has run the bundle (`circuitsvis_bundle_js()`) in a classic `<script>`. This avoids
    repeating the 1.3 MB bundle per view (`view.local_src` inlines it every time) and the CDN
    (`str(view)` loads from unpkg, which fails offline). `div_id` replaces circuitsvis's random
    element id, so a page built twice from the same data is byte-identical.
    """
    source = getattr(view, "local_src", None)
    if not isinstance(source, str):
        raise TypeError(f"expected a circuitsvis RenderedHTML, got {type(view).__name__}")
    match = _RENDER_CALL.search(source)
    if match is None:
        raise RuntimeError("could not find the CircuitsVis.render call in this circuitsvis view")
    element_id = html.escape(div_id or match["uuid"])
    # keep token text from closing the script; 5 decimals of attention are plenty to draw it
    props = compact_numbers(match["props"].strip().replace("</", "<\\/"))
    return (
        f'<div id="{element_id}" style="margin: 15px 0;"></div>\n'
        f'<script>CircuitsVis.render("{element_id}", CircuitsVis.{match["component"]}, {props});</script>'
    )

"""Stage 3 (attention): where the final position looks in the image, per head and layer.

Three sections: the image-attention share of every head (layer x head map, averaged over the
counting images), the final-position attention drawn over one image (PNG tiles + interactive
overlay of the most image-focused head), and a circuitsvis view with image tokens labelled by
grid cell.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

import torch
from jaxtyping import Float
from torch import Tensor

from vlens.demo.data_stage import CountingSample
from vlens.demo.report_sections import Section
from vlens.demo.settings import DemoSettings
from vlens.utils.errors import UserInputError
from vlens.utils.stats import bootstrap_interval, format_interval
from vlens.viz.circuits import attention_heads_view, token_labels
from vlens.viz.figures import layer_head_heatmap
from vlens.viz.image_attention import attention_tiles_figure, attention_to_image

if TYPE_CHECKING:
    from vlens.core.model import HookedVLM


MAX_TILES = 16


def _pattern_names(model: HookedVLM) -> dict[int, str]:
    """layer -> its hook_pattern, for the layers that have an attention pattern (not linear attention)."""
    return {layer: f"blocks.{layer}.attn.hook_pattern" for layer in range(model.cfg.n_layers)
            if not model.cfg.is_linear_attention(layer)}


def final_to_image_attention(model: HookedVLM, inputs) -> Float[Tensor, "batch n_layers n_heads n_image_tokens"]:
    """Attention from each row's final position to its image tokens, every layer and head.

    Rows must have the same number of image tokens (same-size images). A linear-attention layer (a
    hybrid decoder's Gated DeltaNet) has no attention pattern: NaN, as are the cells beyond a layer's heads.
    """
    names = _pattern_names(model)
    with torch.no_grad():
        _, cache = model.run_with_cache(inputs, names_filter=lambda n: n in set(names.values()), return_type=None)
    final = inputs.regions.final
    image_positions = list(inputs.regions.image)
    if len({len(p) for p in image_positions}) != 1:
        raise UserInputError("every image needs the same number of image tokens (use one image size)")
    shape = (inputs.batch_size, model.cfg.max_heads, len(image_positions[0]))
    per_layer = []
    for layer in range(model.cfg.n_layers):
        grid = torch.full(shape, float("nan"))
        if layer in names:
            values = attention_to_image(cache[names[layer]].float().cpu(), final, image_positions)
            grid[:, :values.shape[1]] = values
        per_layer.append(grid)
    return torch.stack(per_layer, dim=1)


def image_attention_per_image(model: HookedVLM, samples: list[CountingSample],
                              batch_size: int) -> Float[Tensor, "n_images n_layers n_heads"]:
    """The attention mass the final position puts on image tokens, per image, layer and head."""
    shares = []
    for start in range(0, len(samples), batch_size):
        chunk = samples[start:start + batch_size]
        inputs = model.prepare(images=[s.image for s in chunk], prompts=[s.question for s in chunk], chat=True)
        shares.append(final_to_image_attention(model, inputs).sum(-1))
    return torch.cat(shares)


def image_attention_share(model: HookedVLM, samples: list[CountingSample], batch_size: int) -> Float[Tensor, "n_layers n_heads"]:
    """Mean over images of the attention mass the final position puts on image tokens."""
    return image_attention_per_image(model, samples, batch_size).mean(0)


def _example(samples: list[CountingSample]) -> CountingSample:
    """The example whose count is the median count (a readable, mid-range picture)."""
    counts = sorted(s.count for s in samples)
    median = counts[len(counts) // 2]
    return next(s for s in samples if s.count == median)


def attention_sections(model: HookedVLM, samples: list[CountingSample], settings: DemoSettings) -> list[Section]:
    per_image = image_attention_per_image(model, samples, settings.batch_size)  # [n, L, H]
    share = per_image.mean(0)
    n_layers, n_heads = share.shape
    ranked = torch.nan_to_num(share, nan=-1.0)  # NaN: no attention pattern (linear attention) or no such head
    top_layer, top_head = divmod(int(ranked.argmax()), n_heads)
    # 95% bootstrap intervals over the images
    top_low, top_high = bootstrap_interval(per_image[:, top_layer, top_head], seed=settings.seed)
    mean_low, mean_high = bootstrap_interval(per_image.flatten(1).nanmean(1), seed=settings.seed)
    # is the top head a clear winner? heads within 0.01 of it, and how often it stays top when images are resampled
    near_top = [f"L{layer}H{head}" for layer in range(n_layers) for head in range(n_heads)
                if float(ranked[layer, head]) >= float(ranked.max()) - 0.01]
    resampled = torch.randint(0, per_image.shape[0], (1000, per_image.shape[0]),
                              generator=torch.Generator().manual_seed(settings.seed))
    weights = torch.zeros(resampled.shape).scatter_add_(1, resampled, torch.ones(resampled.shape))
    flat = torch.nan_to_num(per_image.flatten(1), nan=-1.0)  # a cell without attention never becomes the top
    means = (weights / per_image.shape[0]) @ flat  # [1000, L*H] without a [1000, n, L*H] copy
    stays_top = float((means.argmax(1) == int(ranked.argmax())).double().mean())
    share_section = Section(
        key="attention_share",
        title="Image attention of every head (layer x head)",
        explanation=(f"Attention mass from the final prompt position onto the image tokens, mean over "
                     f"{len(samples)} counting images (95% bootstrap intervals over the images below); bright heads "
                     "read the image when the answer is produced."),
        figure=layer_head_heatmap(share, title="Final position -> image tokens (attention mass)",
                                  value_label="image attention", colorscale="Viridis", zmid=None),
        numbers={"top head": f"L{top_layer}H{top_head}", "top head share": float(ranked.max()),
                 "top head share 95% CI": format_interval(float(ranked.max()), float(top_low), float(top_high)),
                 "heads within 0.01 of the top": ", ".join(near_top),
                 "top head stays top (bootstrap share)": stays_top,
                 "mean share": float(share.nanmean()),
                 "mean share 95% CI": format_interval(float(share.nanmean()), float(mean_low), float(mean_high)),
                 **{f"layer {layer} mean": float(share[layer].nanmean()) for layer in range(n_layers)
                    if not model.cfg.is_linear_attention(layer)}},
        data={"image_attention_share": share},
    )

    example = _example(samples)
    inputs = model.prepare(images=[example.image], prompts=[example.question], chat=True)
    regions = inputs.regions
    assert regions is not None  # prepare() gives every row its token regions
    maps = final_to_image_attention(model, inputs)[0]  # [L, H, n_img]
    # the grid that covers the whole image (an anyres image's base view; no CLS token)
    view = regions.image_view(0, 0)
    maps = maps[..., torch.isin(regions.image[0].cpu(), view.positions.cpu())]
    grid = (int(view.grid[0]), int(view.grid[1]))
    heads = [(layer, head) for layer in range(n_layers) for head in range(n_heads) if not share[layer, head].isnan()]
    if len(heads) > MAX_TILES:  # the most image-focused heads of the whole model
        heads = sorted(heads, key=lambda lh: -float(share[lh]))[:MAX_TILES]
        heads.sort()
    tiles = torch.stack([maps[layer, head] for layer, head in heads])
    figure = attention_tiles_figure(example.image, tiles, grid, titles=[f"L{layer}H{head}" for layer, head in heads],
                                    n_cols=min(n_heads, 8), tile_size=112)
    figure.update_layout(title=f"Final position -> image tokens, {example.count}-object image (one colour scale)")
    overlay_section = Section(
        key="attention_image",
        title="Attention over the image (final position)",
        explanation=(f"Each tile: one head's attention from the final position to the {grid[0]}x{grid[1]} image "
                     f"tokens of a {example.count}-object image, drawn over the picture; all tiles share one "
                     f"colour scale (bar on the right), so a faint tile is a head that looks little. "
                     f"{'The ' + str(len(heads)) + ' most image-focused heads of the model' if len(heads) < n_layers * n_heads else 'Every head'}"
                     f"{' (softmax-attention layers only: linear-attention layers have no attention pattern)' if model.cfg.linear_attention_layers else ''}"
                     " are shown; hover a cell for its weight."),
        figure=figure,
        numbers={"example count": example.count, "heads drawn": len(heads),
                 "top head mass on image": float(maps[top_layer, top_head].sum()),
                 "top head peak cell weight": float(maps[top_layer, top_head].max()),
                 "shared colour scale max": float(tiles.max())},
        data={"heads": [list(h) for h in heads], "grid": list(grid), "maps": tiles,
              "object_centers": [o.get("center") for o in example.record.get("objects", [])]},
    )

    name = _pattern_names(model)[top_layer]
    with torch.no_grad():
        _, cache = model.run_with_cache(inputs, names_filter=lambda n: n == name, return_type=None)
    pattern = cache[name][0].float().cpu()  # [H, pos, pos]
    views = [regions.image_view(0, i) for i in range(len(regions.images[0]))]
    labels = token_labels(cast(list[str], model.to_str_tokens(inputs.input_ids[0])), [v.positions for v in views],
                          [v.grid for v in views])
    circuits_section = Section(
        key="attention_circuitsvis",
        title=f"Attention patterns of layer {top_layer} (circuitsvis)",
        explanation=("Every head of the layer with the most image-focused head, all query and key positions; "
                     "image tokens are labelled img0[row,col] by grid cell — click a head to enlarge it."),
        html=attention_heads_view(pattern, labels, layer=top_layer),
        numbers={"layer": top_layer, "positions": len(labels),
                 "image tokens": int(len(regions.image[0]))},
        data={"tokens": labels},
    )
    return [share_section, overlay_section, circuits_section]

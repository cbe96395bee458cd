"""Stage 4 (visual activation patching): layer x region overwrite rate and the layer x head sweep."""

from __future__ import annotations

import torch

from vlens.demo.report_sections import Section
from vlens.demo.settings import DemoSettings
from vlens.parallel.options import SweepOptions
from vlens.patching import build_pair_batch, make_count_pairs, patch_layer_head, patch_layer_region
from vlens.utils.stats import format_interval, format_share

VAP_TITLE = "VAP: overwrite rate per layer and region"
VAP_EXPLANATION = ("Patch the corrupt image's residual (entering each layer) into the clean run at the image, text, "
                   "final or all positions; the overwrite rate is the share of pairs whose correct clean answer now "
                   "becomes the corrupt count (error bars: 95% Wilson intervals over pairs; curves that coincide are "
                   "drawn one over the other with their own dash and marker).")
HEADS_TITLE = "VAP: layer x head sweep"
HEADS_EXPLANATION = ("Patch one head's output (hook_z, all positions) from the corrupt run; the patch effect is the "
                     "move of the logit difference toward the corrupt run (1 = fully corrupt, 0 = unchanged). The "
                     "top heads' numbers carry 95% bootstrap intervals over pairs, and the share of resamples in "
                     "which the first head stays first.")


def handover_layer(image_rate, final_rate, layers) -> int | str:
    """First layer where patching the final position overwrites more than patching the image tokens
    (the count has moved from the image into the text stream), or "none".

    Example: image [0.8, 0.8, 0.1], final [0.0, 0.1, 0.8], layers [0, 1, 2] -> 2.
    """
    for layer, image, final in zip(layers, image_rate.tolist(), final_rate.tolist(), strict=True):
        if final > image:
            return int(layer)
    return "none"


def effect_bootstrap(per_pair_ld, clean_ld, corrupt_ld, n_resamples: int = 1000, seed: int = 0):
    """Bootstrap over pairs of the normalised patch effect of each head.

    per_pair_ld: [n_heads_flat, n_pairs] patched logit differences; clean_ld / corrupt_ld: [n_pairs].
    Returns (low [n], high [n], share of resamples in which each head has the largest effect [n]).
    The effect is (mean patched - mean clean) / (mean corrupt - mean clean) on the resampled pairs.
    """
    generator = torch.Generator().manual_seed(seed)
    n_pairs = per_pair_ld.shape[-1]
    index = torch.randint(0, n_pairs, (n_resamples, n_pairs), generator=generator)
    patched = per_pair_ld.double()[:, index].nanmean(-1)  # [n, n_resamples]
    clean, corrupt = clean_ld.double()[index].mean(-1), corrupt_ld.double()[index].mean(-1)
    effect = (patched - clean) / (corrupt - clean)  # [n, n_resamples]
    low, high = torch.nanquantile(effect, torch.tensor([0.025, 0.975], dtype=torch.float64), dim=1)
    top_share = torch.bincount(effect.nan_to_num(float("-inf")).argmax(0), minlength=effect.shape[0]) / n_resamples
    return low, high, top_share


def patching_sections(model, settings: DemoSettings, progress: bool = True) -> list[Section]:
    try:
        pairs = make_count_pairs(settings.n_pairs, seed=settings.seed, size=settings.image_size,
                                 style=settings.style, counts=settings.counts)
        batch = build_pair_batch(model, pairs)
    except ValueError as err:  # e.g. a tokenizer that does not split counts into differing tokens
        reason = f"no usable count pairs for this model: {err}"
        return [Section.skipped("vap_layer_region", VAP_TITLE, VAP_EXPLANATION, reason),
                Section.skipped("vap_layer_head", HEADS_TITLE, HEADS_EXPLANATION, reason)]

    regions = patch_layer_region(model, batch, options=SweepOptions(progress=progress))
    rate = regions["overwrite_rate"]  # [L, n_regions]
    low, high = regions.rate_interval("overwrite_rate")
    assert regions.baseline is not None  # the default answer metrics keep the unpatched runs
    clean_accuracy = float(regions.baseline.clean_correct.float().mean())
    numbers: dict[str, int | float | str] = {"pairs": batch.n_pairs, "clean accuracy": clean_accuracy}
    numbers["clean accuracy 95% CI"] = format_share(clean_accuracy, batch.n_pairs)
    for column, region in enumerate(regions.cells):
        best = float(rate[:, column].max())
        at = int(rate[:, column].argmax())
        numbers[f"{region}: max rate"] = best
        numbers[f"{region}: max rate 95% CI"] = format_interval(best, float(low[at, column]), float(high[at, column]))
        numbers[f"{region}: at layer"] = int(regions.layers[at]) if best > 0 else "none"
    numbers["handover layer (final > image)"] = handover_layer(rate[:, list(regions.cells).index("image")],
                                                               rate[:, list(regions.cells).index("final")],
                                                               regions.layers)
    note = "" if clean_accuracy > 0 else " (no clean run is correct, so every rate is 0 here)"
    as_json = regions.to_dict()
    region_section = Section(
        key="vap_layer_region", title=VAP_TITLE, explanation=VAP_EXPLANATION + note,
        figure=regions.plot("overwrite_rate").update_yaxes(range=[0, 1.05]), numbers=numbers,
        data={**{k: as_json[k] for k in ("layers", "regions", "overwrite_rate", "flip_away_rate", "logit_diff",
                                         "patch_effect", "pair_ids", "baseline")},
              "overwrite_rate_interval": {"level": 0.95, "method": "wilson over pairs", "low": low.tolist(),
                                          "high": high.tolist()}},
    )

    heads = patch_layer_head(model, batch, region="all", options=SweepOptions(progress=progress))
    effect = heads["patch_effect"]  # [L, H]
    n_heads = effect.shape[1]
    order = effect.nan_to_num(float("-inf")).flatten().argsort(descending=True)[:5].tolist()
    top = [(heads.layers[i // n_heads], i % n_heads, float(effect.flatten()[i])) for i in order]
    baseline = heads.baseline
    assert baseline is not None  # the default answer metrics keep the unpatched runs
    e_low, e_high, top_share = effect_bootstrap(heads.per_pair_logit_diff.flatten(0, 1), baseline.clean_logit_diff,
                                                baseline.corrupt_logit_diff, seed=settings.seed)
    head_rate = heads["overwrite_rate"]
    r_low, r_high = heads.rate_interval("overwrite_rate")
    at_max = int(head_rate.nan_to_num(-1.0).flatten().argmax())
    head_numbers: dict[str, float | str] = {
        "pairs": batch.n_pairs, "max overwrite rate": float(head_rate.flatten()[at_max]),
        "max overwrite rate 95% CI": format_interval(float(head_rate.flatten()[at_max]), float(r_low.flatten()[at_max]),
                                                     float(r_high.flatten()[at_max]))}
    head_numbers.update({f"#{rank + 1} L{layer}H{head}": format_interval(value, float(e_low[i]), float(e_high[i]))
                         for rank, ((layer, head, value), i) in enumerate(zip(top, order, strict=True))})
    leader = order[0]
    head_numbers["top head stays top (bootstrap share)"] = float(top_share[leader])
    head_section = Section(
        key="vap_layer_head", title=HEADS_TITLE, explanation=HEADS_EXPLANATION,
        figure=heads.plot("patch_effect"), numbers=head_numbers,
        data={"layers": heads.layers, "patch_effect": effect, "overwrite_rate": heads["overwrite_rate"],
              "logit_diff": heads["logit_diff"], "top_heads": [list(t) for t in top],
              "patch_effect_interval": {"level": 0.95, "method": "bootstrap over pairs (1000 resamples)",
                                        "low": e_low.reshape(effect.shape).tolist(),
                                        "high": e_high.reshape(effect.shape).tolist()},
              "top_head_share": top_share.reshape(effect.shape).tolist()},
    )
    return [region_section, head_section]
